// render.js: the rendering shared by the console and the HTML report.
// Every function takes the JSON the API (or the report's embedded data)
// holds and returns HTML; outcomes and reasons are replay's own words,
// rendered by the server (outcome_text, summary, reason), never here.
(function () {
  'use strict';
  function esc(v) {
    return String(v === undefined || v === null ? '' : v)
      .replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;').replace(/"/g, '&quot;');
  }
  function at(t) {
    if (!t) return '-';
    var d = new Date(t);
    // replay's time column: UTC, milliseconds.
    return isNaN(d) ? String(t) : d.toISOString();
  }
  function ago(ms) {
    if (ms === undefined || ms === null) return '-';
    if (ms < 1000) return ms + ' ms';
    var s = ms / 1000;
    if (s < 120) return s.toFixed(1) + ' s';
    if (s < 7200) return (s / 60).toFixed(1) + ' min';
    return (s / 3600).toFixed(1) + ' h';
  }
  // eventsTable renders rows (each what /api/v1/events returns) as the
  // timeline replay prints: seq, at, term, writer, type, outcome, data # reason.
  // opts.href(seq) links each seq (its permalink); opts.stateHref(seq)
  // adds "state at this seq"; opts.target marks one seq.
  function eventsTable(rows, opts) {
    opts = opts || {};
    var h = ['<table class="events"><thead><tr><th>seq</th><th>at</th><th>term</th><th>writer</th><th>type</th><th>outcome</th><th>data &nbsp;# what the fold did</th>'];
    if (opts.stateHref) h.push('<th></th>');
    h.push('</tr></thead><tbody>');
    for (var i = 0; i < rows.length; i++) {
      var r = rows[i];
      var cls = 'outcome-' + esc(r.outcome);
      var tr = r.outcome + (opts.target === r.seq ? ' target' : '');
      var seq = opts.href ? '<a href="' + esc(opts.href(r.seq)) + '">' + esc(r.seq) + '</a>' : esc(r.seq);
      h.push('<tr' + (opts.ids === false ? '' : ' id="ev-' + esc(r.seq) + '"') + ' class="' + esc(tr) + '" data-seq="' + esc(r.seq) + '">',
        '<td class="mono">', seq, '</td><td class="mono">', esc(at(r.at)), '</td><td>', esc(r.term),
        '</td><td>', esc(r.writer || '-'), '</td><td class="mono">', esc(r.type || '-'),
        '</td><td class="', cls, '">', esc(r.outcome_text), '</td><td class="mono">', esc(r.summary),
        r.reason ? ' <span class="reason"># ' + esc(r.reason) + '</span>' : '', '</td>');
      if (opts.stateHref) h.push('<td><a href="' + esc(opts.stateHref(r.seq)) + '">state at this seq</a></td>');
      h.push('</tr>');
    }
    h.push('</tbody></table>');
    if (!rows.length) h.push('<p class="muted">no event matches</p>');
    return h.join('');
  }
  // rejections summarises rejected rows by kind and by writer, as
  // replay --rejected does.
  function rejections(rows) {
    var byKind = {}, byWriter = {}, n = 0;
    rows.forEach(function (r) {
      if (r.outcome !== 'rejected') return;
      n++;
      byKind[r.kind || '-'] = (byKind[r.kind || '-'] || 0) + 1;
      byWriter[r.writer || '-'] = (byWriter[r.writer || '-'] || 0) + 1;
    });
    function list(m) {
      return Object.keys(m).sort().map(function (k) { return esc(k) + ' ' + m[k]; }).join(', ') || '-';
    }
    return '<p>' + n + ' rejected event(s) · by kind: ' + list(byKind) + ' · by writer: ' + list(byWriter) + '</p>';
  }
  // timeline renders /api/v1/timeline as an SVG: one lane per term over
  // the seqs, rejected events as red marks linking to the event.
  function timeline(tl, opts) {
    opts = opts || {};
    var all = tl.terms || [], marks = tl.marks || [];
    if (!all.length) return '<p class="muted">no term has started</p>';
    // The last maxLanes terms (a long log has thousands).
    var maxLanes = opts.maxLanes || 40;
    var terms = all.slice(Math.max(0, all.length - maxLanes));
    var hidden = all.length - terms.length;
    var W = 1200, left = 150, right = 20, laneH = 26, top = 24;
    var H = top + terms.length * laneH + 30;
    var lo = hidden ? terms[0].from_seq : 1, hi = Math.max(tl.tail || 1, lo + 1);
    marks = marks.filter(function (m) { return m.seq >= lo; });
    function x(seq) { return left + (seq - lo) / (hi - lo) * (W - left - right); }
    var idx = {};
    terms.forEach(function (t, i) { idx[t.term] = i; });
    var h = [hidden ? '<p class="muted">the last ' + terms.length + ' of ' + all.length + ' terms (seq ' + lo + ' on); every term.started is in the events (type term)</p>' : ''];
    h.push('<svg class="timeline" viewBox="0 0 ' + W + ' ' + H + '" xmlns="http://www.w3.org/2000/svg">');
    h.push('<text x="' + left + '" y="14">seq ' + lo + '</text><text x="' + (W - right) + '" y="14" text-anchor="end">seq ' + esc(hi) + '</text>');
    terms.forEach(function (t, i) {
      var y = top + i * laneH;
      var x0 = x(t.from_seq), x1 = Math.max(x(t.to_seq), x0 + 3);
      h.push('<text x="4" y="' + (y + 16) + '">term ' + esc(t.term) + ' · ' + esc(t.leader) + '</text>');
      h.push('<rect class="lane' + (t.current ? ' current' : '') + '" x="' + x0.toFixed(1) + '" y="' + (y + 4) + '" width="' + (x1 - x0).toFixed(1) + '" height="' + (laneH - 8) + '" rx="3"><title>term ' + esc(t.term) + ' led by ' + esc(t.leader) + ', seq ' + esc(t.from_seq) + '..' + esc(t.to_seq) + ' (' + esc(at(t.from)) + ' .. ' + esc(at(t.to)) + ')' + (t.ended ? '; ended: ' + esc(t.ended) : '; current') + '</title></rect>');
    });
    marks.forEach(function (m) {
      var i = idx[m.lane_term]; if (i === undefined) i = 0;
      var y = top + i * laneH + laneH / 2, cx = x(m.seq);
      var link = opts.href ? opts.href(m.seq) : '#ev-' + m.seq;
      h.push('<a href="' + esc(link) + '" data-mark="' + esc(m.seq) + '"><path class="mark" d="M' + cx.toFixed(1) + ' ' + (y - 7) + ' l6 7 l-6 7 l-6 -7 z"><title>seq ' + esc(m.seq) + ' ' + esc(m.type) + ' by ' + esc(m.writer) + ' (term ' + esc(m.term) + '): ' + esc(m.outcome) + ': ' + esc(m.reason) + '</title></path></a>');
    });
    h.push('</svg>');
    h.push('<table><thead><tr><th>term</th><th>leader</th><th>lease rev</th><th>seqs</th><th>from</th><th>to</th><th>events</th><th>how it ended</th></tr></thead><tbody>');
    terms.forEach(function (t) {
      h.push('<tr><td>' + esc(t.term) + '</td><td>' + esc(t.leader) + '</td><td>' + esc(t.lease || '-') + '</td><td class="mono">' + esc(t.from_seq) + '..' + esc(t.to_seq) + '</td><td class="mono">' + esc(at(t.from)) + '</td><td class="mono">' + esc(at(t.to)) + '</td><td>' + esc(t.events) + '</td><td>' + (t.current ? '<span class="pill ok">current</span>' : esc(t.ended)) + '</td></tr>');
    });
    h.push('</tbody></table>');
    return h.join('');
  }
  function members(m) {
    return Object.keys(m || {}).sort(function (a, b) { return a - b; }).map(function (r) { return esc(r) + '@' + esc(m[r]); }).join(' ');
  }
  // state renders the document of replay --state --json (/api/v1/state).
  function state(doc, opts) {
    opts = opts || {};
    var s = doc.state || {};
    var h = ['<dl class="kv"><dt>seq</dt><dd>' + esc(s.seq) + '</dd><dt>term</dt><dd>' + esc(s.term) + ' (leader ' + esc(s.leader || '-') + ')</dd><dt>hash</dt><dd class="mono">' + esc(doc.hash) + '</dd><dt>next worker id</dt><dd>' + esc(s.next_worker_id) + '</dd></dl>'];
    var ws = Object.keys(s.workers || {}).map(function (k) { return s.workers[k]; }).sort(function (a, b) { return a.id - b.id; });
    var cap = opts.cap || 500;
    h.push('<h2>Workers (' + ws.length + ')</h2><table><thead><tr><th>id</th><th>epoch</th><th>endpoint</th><th>state</th><th>term</th><th>kind</th></tr></thead><tbody>');
    ws.slice(0, cap).forEach(function (w) {
      h.push('<tr><td>' + esc(w.id) + '</td><td>' + esc(w.epoch) + '</td><td class="mono">' + esc(w.endpoint) + '</td><td>' + esc(w.state) + '</td><td>' + esc(w.term) + '</td><td>' + esc(w.kind) + '</td></tr>');
    });
    h.push('</tbody></table>');
    if (ws.length > cap) h.push('<p class="muted">first ' + cap + ' of ' + ws.length + '</p>');
    var st = Object.keys(s.stores || {}).sort().map(function (k) { return s.stores[k]; });
    h.push('<h2>Stores (' + st.length + ')</h2><table><thead><tr><th>store</th><th>state</th><th>raft</th><th>until</th></tr></thead><tbody>');
    st.forEach(function (x) { h.push('<tr><td>' + esc(x.id) + '</td><td>' + esc(x.state) + '</td><td class="mono">' + esc(x.raft_addr) + '</td><td>' + esc(x.until ? at(x.until) : '-') + '</td></tr>'); });
    h.push('</tbody></table>');
    var sh = Object.keys(s.shards || {}).map(function (k) { return s.shards[k]; }).sort(function (a, b) { return a.id - b.id; });
    h.push('<h2>Shards (' + sh.length + ')</h2><table><thead><tr><th>shard</th><th>members</th><th>ccid</th><th>leader</th><th>operator</th><th>blocked</th></tr></thead><tbody>');
    sh.slice(0, cap).forEach(function (x) { h.push('<tr><td>' + esc(x.id) + '</td><td class="mono">' + members(x.members) + '</td><td>' + esc(x.ccid) + '</td><td>' + esc(x.leader) + '</td><td>' + esc(x.operator || '-') + '</td><td>' + esc(x.blocked || '-') + '</td></tr>'); });
    h.push('</tbody></table>');
    var an = s.anomalies || [];
    h.push('<h2>Anomalies (' + an.length + ', newest last)</h2><table><thead><tr><th>seq</th><th>term</th><th>writer</th><th>type</th><th>kind</th><th>reason</th></tr></thead><tbody>');
    an.forEach(function (a) { h.push('<tr><td>' + esc(a.seq) + '</td><td>' + esc(a.term) + '</td><td>' + esc(a.writer) + '</td><td class="mono">' + esc(a.type) + '</td><td>' + esc(a.kind) + '</td><td>' + esc(a.reason) + '</td></tr>'); });
    h.push('</tbody></table>');
    var c = s.counters || {};
    h.push('<p class="muted">applied ' + esc(c.applied) + ' · noops ' + esc(c.noops) + ' · rejected ' + esc(c.rejected) + ' (stale term ' + esc(c.stale_term) + ') · corrupt ' + esc(c.corrupt) + '</p>');
    return h.join('');
  }
  window.TL = { esc: esc, at: at, ago: ago, eventsTable: eventsTable, rejections: rejections, timeline: timeline, state: state, members: members };
})();
