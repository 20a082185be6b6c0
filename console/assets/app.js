// app.js: the console's pages. They read only /api/v1/ and follow
// /api/v1/watch (server-sent events) to redraw without a reload.
(function () {
  'use strict';
  var TL = window.TL, esc = TL.esc;
  var main = document.getElementById('main');
  var banner = document.getElementById('banner');
  var current = null; // the page's redraw function
  var seqShown = 0;

  function api(path) {
    return fetch('/api/v1/' + path, { headers: { Accept: 'application/json' } }).then(function (r) {
      return r.json().then(function (j) {
        if (!r.ok) throw new Error(j.error || r.statusText);
        return j;
      });
    });
  }
  function route() {
    var h = location.hash.replace(/^#/, '') || '/';
    var q = h.indexOf('?');
    var path = q < 0 ? h : h.slice(0, q);
    var params = new URLSearchParams(q < 0 ? '' : h.slice(q + 1));
    return { path: path, params: params };
  }
  function qs(params) {
    var s = params.toString();
    return s ? '?' + s : '';
  }
  function setNav(name) {
    document.querySelectorAll('header nav a').forEach(function (a) {
      a.classList.toggle('active', a.getAttribute('data-nav') === name);
    });
  }

  // The red banner: what the console's banners decided (console/banner.go),
  // each with what to do (the README's runbook, "When the console shows a
  // red banner").
  function drawBanner(st) {
    var out = [];
    (st.banners || []).forEach(function (b) {
      if (b.kind === 'no-leader') {
        out.push('<p><b>No meta leader holds the lease.</b> Check that at least one <code>termlog meta run</code> replica is up and reaches NATS; a new leader takes over within a lease.</p>');
      } else if (b.kind === 'no-quorum') {
        out.push('<p><b>Shard ' + esc(b.shard) + ' has no quorum: ' + esc(b.running || 0) + ' of ' + esc(b.expected) + ' replicas running.</b> No config change is proposed until a quorum runs, and Raft cannot commit. Bring back the stores of its stopped replicas (' + esc((b.stopped || []).join(' ')) + ') with their data dirs: a stopped store rejoins with its replicas; see the README, <i>When the console shows a red banner</i>.</p>');
      } else if (b.kind === 'no-raft-leader') {
        out.push('<p><b>Shard ' + esc(b.shard) + ' has no Raft leader.</b> Its running replicas know none: check the stores\' Raft addresses and logs; an election normally ends within seconds.</p>');
      }
    });
    banner.innerHTML = out.length ? '<div class="banner" id="red-banner">' + out.join('') + '</div>' : '';
  }
  function header(st) {
    document.getElementById('hdr-term').textContent = 'term ' + st.term + ' · leader ' + (st.leader || '-');
    document.getElementById('hdr-seq').textContent = 'seq ' + st.seq;
    seqShown = st.seq;
  }

  function overview() {
    setNav('overview');
    return api('status?brief=1').then(function (st) {
      header(st); drawBanner(st);
      var h = st.health || {}, rec = h.record;
      var holder = st.lease_error ? 'unknown (' + st.lease_error + ')' : (st.lease_holder || 'none (no leader holds the lease)');
      var v = h.healthy
        ? '<div class="verdict ok" id="verdict">HEALTHY<small>termlog status exits 0</small></div>'
        : '<div class="verdict bad" id="verdict">DEGRADED<small>termlog status exits ' + esc(st.exit) + ': ' + esc((h.problems || []).length) + ' problem(s)</small></div>';
      var probs = (h.problems || []).length ? '<ul class="problems" id="problems">' + h.problems.map(function (p) { return '<li>' + esc(p) + '</li>'; }).join('') + '</ul>' : '';
      var ws = st.worker_states || {};
      var wsText = Object.keys(ws).sort().map(function (k) { return esc(k) + ' ' + ws[k]; }).join(', ') || 'none';
      main.innerHTML = '<h1>Overview · cluster ' + esc(st.cluster) + '</h1>' + v + (probs ? '<div class="card">' + probs + '</div>' : '') +
        (st.stream_error ? '<div class="card"><b>The console cannot read the stream:</b> ' + esc(st.stream_error) + '</div>' : '') +
        '<div class="grid2"><div class="card"><dl class="kv">' +
        '<dt>leader</dt><dd id="leader">' + esc(st.leader || '-') + '</dd>' +
        '<dt>term</dt><dd id="term">' + esc(st.term) + (st.term_lease ? ' (lease rev ' + esc(st.term_lease) + ')' : '') + '</dd>' +
        '<dt>term started</dt><dd>' + (st.term_since ? esc(TL.at(st.term_since)) + ' (' + esc(TL.ago(st.term_age_ms)) + ' ago)' : '-') + '</dd>' +
        '<dt>lease holder</dt><dd id="holder">' + esc(holder) + '</dd>' +
        '<dt>health record</dt><dd>' + (rec ? 'from ' + esc(rec.leader) + ' term ' + esc(rec.term) + ' at seq ' + esc(rec.seq) + ', ' + esc(TL.ago(h.age_ms)) + ' old' : 'none published') + '</dd>' +
        '<dt>seq</dt><dd>' + esc(st.seq) + ' <span class="mono muted">' + esc(st.hash) + '</span></dd>' +
        '</dl></div><div class="card"><dl class="kv">' +
        '<dt>workers</dt><dd>' + wsText + '</dd>' +
        '<dt>stores</dt><dd>' + esc((st.stores || []).map(function (s) { return s.id + ' ' + s.state; }).join(', ') || 'none') + '</dd>' +
        '<dt>shards</dt><dd>' + esc((rec && rec.shards || []).map(function (s) { return s.shard + ': ' + s.running + '/' + s.expected; }).join('  ') || (st.shards || []).length) + '</dd>' +
        '<dt>recovery</dt><dd>' + esc(rec ? rec.recovery.state || '-' : '-') + '</dd>' +
        '<dt>events</dt><dd>applied ' + esc(st.counters.applied) + ' · rejected <a href="#/events?outcome=rejected">' + esc(st.counters.rejected) + '</a> (stale term ' + esc(st.counters.stale_term) + ') · corrupt ' + esc(st.counters.corrupt) + '</dd>' +
        '</dl></div></div>';
    });
  }

  function workers(p) {
    setNav('workers');
    var offset = +(p.get('offset') || 0), limit = 100;
    var q = new URLSearchParams({ offset: offset, limit: limit });
    if (p.get('state')) q.set('state', p.get('state'));
    if (p.get('q')) q.set('q', p.get('q'));
    return api('workers?' + q).then(function (r) {
      var h = ['<h1>Workers</h1><form class="filters" id="wf"><label>state<select name="state"><option value="">any</option>'];
      ['starting', 'running'].forEach(function (s) { h.push('<option' + (p.get('state') === s ? ' selected' : '') + '>' + s + '</option>'); });
      h.push('</select></label><label>id / endpoint / kind<input name="q" value="' + esc(p.get('q') || '') + '"></label><button>filter</button></form>');
      h.push('<p class="muted">' + r.matched + ' of ' + r.total + ' workers at seq ' + r.seq + ' · heartbeats are kept in the leader\'s memory only, not in the stream</p>');
      h.push('<table id="workers"><thead><tr><th>id</th><th>epoch</th><th>endpoint</th><th>state</th><th>registered in term</th><th>kind</th><th>parallelism</th><th>incarnation</th><th></th></tr></thead><tbody>');
      r.workers.forEach(function (w) {
        h.push('<tr><td>' + esc(w.id) + '</td><td>' + esc(w.epoch) + '</td><td class="mono">' + esc(w.endpoint) + '</td><td><span class="pill ' + (w.state === 'running' ? 'ok' : 'warn') + '">' + esc(w.state) + '</span></td><td>' + esc(w.term) + '</td><td>' + esc(w.kind) + '</td><td>' + esc(w.parallelism) + '</td><td class="mono">' + esc(w.incarnation) + '</td><td><a href="#/events?worker=' + esc(w.id) + '">history</a></td></tr>');
      });
      h.push('</tbody></table>');
      h.push(pager(offset, limit, r.matched, function (o) { var n = new URLSearchParams(p); n.set('offset', o); return '#/workers' + qs(n); }));
      main.innerHTML = h.join('');
      formNav('wf', '#/workers');
    });
  }
  function pager(offset, limit, total, href) {
    var h = '<div class="pager">';
    if (offset > 0) h += '<a class="btn" href="' + href(Math.max(0, offset - limit)) + '">← previous</a>';
    h += '<span class="muted">' + (total ? offset + 1 : 0) + '–' + Math.min(offset + limit, total) + ' of ' + total + '</span>';
    if (offset + limit < total) h += '<a class="btn" href="' + href(offset + limit) + '">next →</a>';
    return h + '</div>';
  }
  function formNav(id, base) {
    var f = document.getElementById(id);
    f.addEventListener('submit', function (e) {
      e.preventDefault();
      var n = new URLSearchParams();
      new FormData(f).forEach(function (v, k) { if (v) n.set(k, v); });
      location.hash = base + qs(n);
    });
  }

  function shards() {
    setNav('shards');
    return Promise.all([api('shards'), api('stores'), api('status?brief=1')]).then(function (res) {
      var sh = res[0], st = res[1];
      header(res[2]); drawBanner(res[2]);
      var health = {};
      (sh.health || []).forEach(function (x) { health[x.shard] = x; });
      var h = ['<h1>Shards and stores</h1><p class="muted">per-replica state from the health record the meta leader publishes (' + TL.ago(sh.age_ms) + ' old); membership from the stream at seq ' + sh.seq + '</p>'];
      h.push('<table id="shards"><thead><tr><th>shard</th><th>replica</th><th>store</th><th>running</th><th>Raft leader</th><th>ccid</th><th>operator</th><th>pending</th><th>blocked / why</th></tr></thead><tbody>');
      (sh.shards || []).forEach(function (s) {
        var hh = health[s.id] || {};
        var running = {};
        (hh.running_replicas || []).forEach(function (r) { running[r] = true; });
        var ids = Object.keys(s.members || {}).sort(function (a, b) { return a - b; });
        ids.forEach(function (r, i) {
          var run = !hh.shard ? '<span class="pill">unknown</span>' : running[r] ? '<span class="pill ok">running</span>' :
            (sh.collecting || []).indexOf(s.members[r]) >= 0 ? '<span class="pill warn" title="the leader has not heard from this store yet this term">not heard yet</span>' : '<span class="pill bad">not running</span>';
          h.push('<tr data-shard="' + esc(s.id) + '" data-replica="' + esc(r) + '"><td>' + (i === 0 ? '<b>' + esc(s.id) + '</b> ' + (hh.shard ? esc(hh.running) + '/' + esc(hh.expected) : '') : '') + '</td><td>' + esc(r) + '</td><td>' + esc(s.members[r]) + '</td><td class="replica-state">' + run + '</td><td>' + (+r === hh.leader ? '<span class="pill ok">leader</span>' + (hh.raft_term ? ' raft term ' + esc(hh.raft_term) : '') : '') + '</td>' +
            '<td>' + (i === 0 ? esc(s.ccid) : '') + '</td><td>' + (i === 0 ? esc(s.operator ? s.operator + (hh.step ? ' (' + hh.step + ')' : '') : '-') : '') + '</td><td>' + (i === 0 ? esc((hh.pending || []).join(', ') || '-') : '') + '</td><td>' + (i === 0 ? esc(s.blocked || hh.why || (hh.healthy ? 'healthy' : '-')) : '') + '</td></tr>');
        });
      });
      h.push('</tbody></table>');
      var sth = {};
      (st.health || []).forEach(function (x) { sth[x.store] = x; });
      h.push('<h2>Stores</h2><table id="stores"><thead><tr><th>store</th><th>state</th><th>live</th><th>replicas running</th><th>last report</th><th>drain until</th><th>drained by</th><th>raft</th></tr></thead><tbody>');
      (st.stores || []).forEach(function (s) {
        var x = sth[s.id] || {};
        var age = x.last_heartbeat && st.record_at ? (new Date(st.record_at) - new Date(x.last_heartbeat)) + st.age_ms : null;
        h.push('<tr><td>' + esc(s.id) + '</td><td><span class="pill ' + (s.state === 'up' ? 'ok' : s.state === 'down' ? 'bad' : 'warn') + '">' + esc(s.state) + '</span></td><td>' + (x.store ? (x.live ? 'yes' : '<b>no</b>') : '-') + '</td><td>' + esc(x.replicas === undefined ? '-' : x.replicas) + '</td><td>' + (age === null ? 'none this term' : esc(TL.ago(age)) + ' ago') + '</td><td>' + esc(s.until ? TL.at(s.until) : '-') + '</td><td>' + esc(s.drained_by || '-') + '</td><td class="mono">' + esc(s.raft_addr) + '</td></tr>');
      });
      h.push('</tbody></table>');
      main.innerHTML = h.join('');
    });
  }

  function timelinePage() {
    setNav('timeline');
    return api('timeline').then(function (tl) {
      main.innerHTML = '<h1>Timeline</h1><p class="muted">terms as lanes over the stream\'s seqs; a red mark is a rejected event (click for the event)</p>' +
        TL.timeline(tl, { href: function (seq) { return '#/event/' + seq; } }) +
        '<h2>Rejected and corrupt events</h2>' + (tl.marks.length ? '<ul>' + tl.marks.map(function (m) { return '<li><a href="#/event/' + m.seq + '">seq ' + m.seq + '</a> ' + esc(m.type) + ' by ' + esc(m.writer) + ' (term ' + m.term + '): ' + esc(m.outcome) + ': ' + esc(m.reason) + '</li>'; }).join('') + '</ul>' : '<p class="muted">none</p>');
    });
  }

  var eventFields = ['type', 'term', 'writer', 'worker', 'shard', 'store', 'outcome'];
  function eventsPage(p) {
    setNav('events');
    var q = new URLSearchParams({ limit: 100 });
    eventFields.forEach(function (k) { if (p.get(k)) q.set(k, p.get(k)); });
    var desc = !p.get('from');
    if (desc) { q.set('order', 'desc'); if (p.get('before')) q.set('before', p.get('before')); } else q.set('from', p.get('from'));
    return api('events?' + q).then(function (r) {
      var rows = desc ? r.events.slice().reverse() : r.events;
      var h = ['<h1>Events</h1><form class="filters" id="ef">'];
      eventFields.forEach(function (k) {
        if (k === 'outcome') {
          h.push('<label>outcome<select name="outcome"><option value="">any</option>');
          ['applied', 'noop', 'rejected', 'corrupt'].forEach(function (o) { h.push('<option' + (p.get('outcome') === o ? ' selected' : '') + '>' + o + '</option>'); });
          h.push('</select></label>');
        } else h.push('<label>' + k + '<input name="' + k + '" value="' + esc(p.get(k) || '') + '"></label>');
      });
      h.push('<button>filter</button></form>');
      h.push('<p class="muted">' + (desc ? 'newest matching events' : 'from seq ' + esc(p.get('from'))) + ' · the outcome and reason are replay\'s · tail seq ' + r.tail + '</p>');
      h.push(TL.eventsTable(rows, { href: function (s) { return '#/event/' + s; }, stateHref: function (s) { return '#/state/' + s; } }));
      var n = new URLSearchParams(p);
      h.push('<div class="pager">');
      if (desc && r.next) { n.set('before', r.next); h.push('<a class="btn" href="#/events' + qs(n) + '">older →</a>'); }
      if (!desc && r.next) { n.set('from', r.next); h.push('<a class="btn" href="#/events' + qs(n) + '">newer →</a>'); }
      h.push('</div>');
      main.innerHTML = h.join('');
      formNav('ef', '#/events');
    });
  }
  function eventPage(seq) {
    setNav('events');
    return api('events/' + seq).then(function (r) {
      main.innerHTML = '<h1>Event ' + esc(r.seq) + '</h1>' + TL.eventsTable([r], { target: r.seq, stateHref: function (s) { return '#/state/' + s; } }) +
        '<h2>Data</h2><pre class="card mono">' + esc(JSON.stringify(r, null, 2)) + '</pre>' +
        '<p><a href="#/state/' + r.seq + '">state at this seq</a> · <a href="#/events?from=' + Math.max(1, r.seq - 10) + '">events around it</a></p>';
    });
  }
  function statePage(seq) {
    setNav('events');
    return api('state?seq=' + seq).then(function (doc) {
      main.innerHTML = '<h1>State at seq ' + esc(doc.state.seq) + '</h1><p class="muted">the fold of every event up to seq ' + esc(seq) + ', as <code>termlog replay --until-seq ' + esc(seq) + '</code> prints it · <a href="#/event/' + esc(seq) + '">the event</a></p>' + TL.state(doc);
    });
  }

  function show() {
    var r = route(), p = r.path, m;
    if (p === '/' || p === '') current = overview;
    else if (p === '/workers') current = function () { return workers(r.params); };
    else if (p === '/shards') current = shards;
    else if (p === '/timeline') current = timelinePage;
    else if (p === '/events') current = function () { return eventsPage(r.params); };
    else if ((m = p.match(/^\/event\/(\d+)$/))) current = function () { return eventPage(m[1]); };
    else if ((m = p.match(/^\/state\/(\d+)$/))) current = function () { return statePage(m[1]); };
    else current = function () { main.innerHTML = '<p>no such page</p>'; return Promise.resolve(); };
    redraw();
  }
  var drawing = false, again = false;
  function redraw() {
    if (drawing) { again = true; return; }
    drawing = true;
    var scroll = window.scrollY;
    current().catch(function (e) { main.innerHTML = '<div class="card"><b>error:</b> ' + esc(e.message) + '</div>'; })
      .then(function () {
        window.scrollTo(0, scroll);
        drawing = false;
        if (again) { again = false; redraw(); }
      });
  }
  window.addEventListener('hashchange', show);
  // Live: redraw on every change the server announces; the static pages
  // (one event, a past state) do not move.
  var live = document.getElementById('live');
  function connect() {
    var es = new EventSource('/api/v1/watch');
    es.addEventListener('open', function () { live.textContent = 'live'; live.className = 'live on'; });
    es.addEventListener('change', function (e) {
      var d = JSON.parse(e.data);
      document.getElementById('hdr-term').textContent = 'term ' + d.term + ' · leader ' + (d.leader || '-');
      document.getElementById('hdr-seq').textContent = 'seq ' + d.seq;
      var p = route().path;
      if (!/^\/(event|state)\//.test(p)) redraw();
    });
    es.addEventListener('error', function () { live.textContent = 'reconnecting'; live.className = 'live off'; });
  }
  show();
  connect();
})();
