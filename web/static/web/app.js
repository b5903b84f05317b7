/* Epochal dashboard: draw the Plotly figures the server sends, redraw what changed after
   each live refresh (htmx out-of-band swaps), and mark the selected lineage row. */
(function () {
  "use strict";

  function chartConfig() {
    var node = document.getElementById("chart-config");
    return node ? JSON.parse(node.textContent) : { displaylogo: false, responsive: true };
  }

  function drawCharts() {
    var blob = document.getElementById("chart-data");
    if (!blob || !window.Plotly) return;
    var figures = JSON.parse(blob.textContent);
    var config = chartConfig();
    Object.keys(figures).forEach(function (name) {
      var el = document.getElementById("chart-" + name);
      var figure = figures[name];
      if (!el || el.dataset.version === figure.version) return;
      window.Plotly.react(el, figure.data, figure.layout, config);
      el.dataset.version = figure.version;
      el.dataset.traces = String(figure.data.length);
    });
  }

  function ready() {
    drawCharts();
    document.body.addEventListener("htmx:oobAfterSwap", function (event) {
      var target = event.detail && event.detail.target;
      if (target && target.id === "chart-data-box") drawCharts();
    });
    document.body.addEventListener("htmx:afterSettle", drawCharts);
    // Live parts (data-watch) hold a request open until what they show changes (see
    // web/live.py); when it ends without a new fragment (304, or an error) ask again.
    document.body.addEventListener("htmx:afterRequest", function (event) {
      var elt = event.detail && event.detail.elt;
      if (!elt || !elt.hasAttribute || !elt.hasAttribute("data-watch")) return;
      var status = event.detail.xhr ? event.detail.xhr.status : 0;
      if (status === 200 && elt.isConnected === false) return; // swapped: the new one asks
      if (status === 200 && elt.getAttribute("hx-swap") !== "none") return;
      window.setTimeout(function () {
        if (elt.isConnected) window.htmx.trigger(elt, "epochal:watch");
      }, status === 304 || status === 200 ? 0 : 2000);
    });
    document.body.addEventListener("click", function (event) {
      var link = event.target.closest && event.target.closest(".graph-row a.snap");
      if (!link) return;
      document.querySelectorAll(".graph-row.selected").forEach(function (row) {
        row.classList.remove("selected");
      });
      link.parentElement.classList.add("selected");
    });
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", ready);
  } else {
    ready();
  }
})();
