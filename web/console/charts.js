// Chart.js with only the parts the console draws (tree-shaken by esbuild); no
// animation, so a chart is drawn once, when its data is set.

import { Chart, LineController, LineElement, PointElement, BarController, BarElement, LinearScale, CategoryScale, Tooltip, Legend, Filler } from 'chart.js';
import { cssVar } from './ui.js';

Chart.register(LineController, LineElement, PointElement, BarController, BarElement, LinearScale, CategoryScale, Tooltip, Legend, Filler);

export function chart(canvas, config) {
  Chart.defaults.color = cssVar('--muted') || '#666';
  Chart.defaults.borderColor = cssVar('--line') || '#ddd';
  return new Chart(canvas, {
    ...config,
    options: { animation: false, responsive: true, maintainAspectRatio: false, ...config.options },
  });
}
