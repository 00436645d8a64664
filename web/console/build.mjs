// Builds the console into console/dist (embedded by the Go package `console`):
// app.js and everything it imports bundled and minified by esbuild, with content-hashed
// names so the server can let browsers keep them for good, and index.html pointing at
// them. Run by `make web` (node console/build.mjs, from web/).
import * as esbuild from 'esbuild';
import { createHash } from 'node:crypto';
import { mkdir, readFile, rm, writeFile } from 'node:fs/promises';
import { basename, dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const dist = join(here, '..', '..', 'console', 'dist');
const assets = join(dist, 'assets');

await rm(assets, { recursive: true, force: true });
await mkdir(assets, { recursive: true });

const result = await esbuild.build({
  entryPoints: [join(here, 'app.js')],
  bundle: true,
  minify: true,
  format: 'iife',
  target: ['es2022', 'chrome110', 'firefox115', 'safari16'],
  outdir: assets,
  entryNames: '[name]-[hash]',
  assetNames: '[name]-[hash]',
  metafile: true,
  legalComments: 'linked',
  logLevel: 'warning',
});

const out = Object.entries(result.metafile.outputs);
const url = (ext) => {
  const found = out.find(([file, o]) => file.endsWith(ext) && (o.entryPoint || o.cssBundle || ext === '.css'));
  if (!found) throw new Error(`esbuild wrote no ${ext} bundle`);
  return `/assets/${basename(found[0])}`;
};

const icon = await readFile(join(here, 'favicon.svg'));
const iconName = `favicon-${createHash('sha256').update(icon).digest('hex').slice(0, 8)}.svg`;
await writeFile(join(assets, iconName), icon);

const page = (await readFile(join(here, 'index.html'), 'utf8'))
  .replace('{{JS}}', url('.js'))
  .replace('{{CSS}}', url('.css'))
  .replace('{{ICON}}', `/assets/${iconName}`);
await writeFile(join(dist, 'index.html'), page);
console.log(`console: ${out.length + 2} files in ${dist}`);
