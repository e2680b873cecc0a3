// The dashboard's charts (issue 27): every <canvas data-chart-src="/api/..."> becomes a Chart.js
// line chart of the JSON that URL answers ({labels: [...], series: [{label, data}]}), fetched
// again every data-refresh-s seconds. A file of its own because the pages allow no inline script
// (Content-Security-Policy: default-src 'self').
'use strict';

(function () {
  function draw(canvas) {
    const src = canvas.dataset.chartSrc;
    const every = Number(canvas.dataset.refreshS || '0');
    let chart = null;
    async function refresh() {
      try {
        const resp = await fetch(src, { credentials: 'same-origin', cache: 'no-store' });
        if (!resp.ok) throw new Error(`${resp.status} ${resp.statusText}`);
        const data = await resp.json();
        const datasets = data.series.map(s => ({ label: s.label, data: s.data, tension: 0.2 }));
        if (chart === null) {
          chart = new Chart(canvas, {
            type: 'line',
            data: { labels: data.labels, datasets },
            options: {
              animation: false,
              responsive: false,
              scales: { y: { beginAtZero: true, title: { display: true, text: data.unit } } },
            },
          });
        } else {
          chart.data.labels = data.labels;
          chart.data.datasets = datasets;
          chart.update();
        }
        canvas.dataset.refreshed = String(Number(canvas.dataset.refreshed || '0') + 1);
        canvas.title = '';
      } catch (err) {
        canvas.title = `chart not refreshed: ${err}`;  // shown on hover; the page still works
      }
    }
    refresh();
    if (every > 0) setInterval(refresh, every * 1000);
  }
  document.querySelectorAll('canvas[data-chart-src]').forEach(draw);
})();
