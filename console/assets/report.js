// report.js: unpacks the report's embedded data (gzip, base64) and renders
// it with render.js, the console's code.
(function () {
  'use strict';
  var TL = window.TL, esc = TL.esc, main = document.getElementById('main');
  var PAGE = 200;
  function unpack() {
    var b64 = document.getElementById('data').getAttribute('data-z');
    var bin = atob(b64), bytes = new Uint8Array(bin.length);
    for (var i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    var stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream('gzip'));
    return new Response(stream).text().then(JSON.parse);
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
    document.body.setAttribute('data-ready', '1');
  }
  unpack().then(render).catch(function (e) {
    main.innerHTML = '<div class="card"><b>cannot unpack the report:</b> ' + esc(e.message) + '</div>';
  });
})();
