// report.js: unpacks the report's embedded data (gzip, base64) and renders
// it with render.js, the console's code.
(function () {
  'use strict';
  var TL = window.TL, esc = TL.esc, main = document.getElementById('main');
  var PAGE = 200;
  var timing = window.__timing = { start: performance.now() };
  function unpack() {
    var b64 = document.getElementById('data').getAttribute('data-z');
    var bin = atob(b64), bytes = new Uint8Array(bin.length);
    for (var i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    var stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream('gzip'));
    timing.decoded = performance.now();
    return new Response(stream).text().then(function (txt) {
      timing.unzipped = performance.now();
      var d = JSON.parse(txt);
      timing.parsed = performance.now();
      unpackRows(d);
      timing.rows = performance.now();
      return d;
    });
  }
  // unpackRows turns the packed rows back into the rows the API serves.
  function unpackRows(d) {
    var p = d.packed, dict = p.dict, base = Date.parse(p.base), all = new Array(p.rows.length);
    for (var i = 0; i < p.rows.length; i++) {
      var a = p.rows[i];
      all[i] = { seq: a[0], at: a[1] < 0 ? '' : new Date(base + a[1]).toISOString(), term: a[2], writer: dict[a[3]], type: dict[a[4]], outcome: dict[a[5]], kind: dict[a[6]], outcome_text: dict[a[7]], reason: a[8], summary: a[9] };
    }
    function pick(ix) { return ix.map(function (i) { return all[i]; }); }
    d.rows = pick(p.table);
    d.rejected = pick(p.rejected);
    d.histories.forEach(function (h) { h.rows = pick(h.index); });
  }
  function render(d) {
    var href = function (seq) { return '#ev-' + seq; };
    var h = ['<h1>' + esc(d.title) + '</h1><p class="muted">generated ' + esc(TL.at(d.generated)) + ' · ' + d.events + ' events folded · ' + d.shown + ' in the table' + (d.filter ? ' (filter ' + esc(d.filter) + ')' : '') + '</p>'];
    h.push('<h2 id="timeline">Timeline</h2>' + TL.timeline(d.timeline, { href: href }));
    h.push('<h2 id="rejections">Rejections</h2>' + TL.rejections(d.rejected) + TL.eventsTable(d.rejected, { href: href, ids: false }));
    h.push('<h2 id="events">Events</h2><form class="filters" id="rf"><label>outcome<select name="outcome"><option value="">any</option><option>applied</option><option>noop</option><option>rejected</option><option>corrupt</option></select></label><label>type<input name="type"></label><label>seq<input name="seq"></label></form><div id="evpage"></div>');
    h.push('<h2 id="histories">Histories</h2>');
    if (!d.histories.length) h.push('<p class="muted">none asked for (replay --html --history worker:ID)</p>');
    d.histories.forEach(function (x) { h.push('<h2>' + esc(x.subject) + '</h2>' + TL.eventsTable(x.rows, { href: href, ids: false })); });
    h.push('<h2 id="state">Final state</h2>' + TL.state(d.state));
    main.innerHTML = h.join('');
    var form = document.getElementById('rf'), page = 0, rows = d.rows;
    function filtered() {
      var o = form.outcome.value, t = form.type.value;
      return rows.filter(function (r) { return (!o || r.outcome === o) && (!t || (r.type || '').indexOf(t) === 0); });
    }
    function draw(target) {
      var list = filtered();
      if (target) {
        for (var i = 0; i < list.length; i++) if (list[i].seq === target) { page = Math.floor(i / PAGE); break; }
      }
      var pages = Math.max(1, Math.ceil(list.length / PAGE));
      page = Math.min(page, pages - 1);
      var p = '<div class="pager"><button type="button" id="prev">← previous</button><span class="muted">page ' + (page + 1) + ' of ' + pages + ' · ' + list.length + ' rows</span><button type="button" id="next">next →</button></div>';
      document.getElementById('evpage').innerHTML = p + TL.eventsTable(list.slice(page * PAGE, (page + 1) * PAGE), { target: target }) + p;
      document.querySelectorAll('#prev').forEach(function (b) { b.onclick = function () { page = Math.max(0, page - 1); draw(); }; });
      document.querySelectorAll('#next').forEach(function (b) { b.onclick = function () { page++; draw(); }; });
      if (target) { var el = document.getElementById('ev-' + target); if (el) el.scrollIntoView(); }
    }
    form.addEventListener('change', function () { page = 0; draw(); });
    form.addEventListener('submit', function (e) { e.preventDefault(); });
    form.seq.addEventListener('change', function () { var s = +form.seq.value; if (s) draw(s); });
    function jump() {
      var m = location.hash.match(/^#ev-(\d+)$/);
      if (m) { form.outcome.value = ''; form.type.value = ''; draw(+m[1]); }
    }
    window.addEventListener('hashchange', jump);
    draw();
    jump();
    timing.rendered = performance.now();
    document.body.setAttribute('data-ready', '1');
  }
  unpack().then(render).catch(function (e) {
    main.innerHTML = '<div class="card"><b>cannot unpack the report:</b> ' + esc(e.message) + '</div>';
  });
})();
