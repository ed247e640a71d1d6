// The dashboard's browser tests share this: Debian's Chromium through playwright-core, a page
// that records everything that must never happen (dialogs, page and console errors, CSP
// violations), and an axe-core scan that fails on a serious or critical violation.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import { createRequire } from 'node:module';
import { chromium } from 'playwright-core';

const require = createRequire(import.meta.url);
const AXE = fs.readFileSync(require.resolve('axe-core/axe.min.js'), 'utf8');
const CHROMIUM = process.env.CHROMIUM_PATH ?? '/usr/bin/chromium';

export function launchChromium() {
  return chromium.launch({
    executablePath: CHROMIUM,
    args: ['--no-sandbox', '--headless=new', '--disable-gpu', '--disable-background-networking', '--disable-component-update', '--disable-sync', '--no-first-run'],
  });
}

/** A page that records everything that must never happen: dialogs, CSP violations, page errors. */
export async function newPage(context) {
  const page = await context.newPage();
  const trouble = [];
  page.on('dialog', (d) => {
    trouble.push(`dialog: ${d.message()}`);
    void d.dismiss();
  });
  page.on('pageerror', (e) => trouble.push(`page error: ${e.message}`));
  page.on('console', (m) => {
    if (m.type() === 'error') trouble.push(`console error: ${m.text()}`);
  });
  await page.addInitScript(() => {
    window.__violations = [];
    document.addEventListener('securitypolicyviolation', (e) => window.__violations.push(`${e.violatedDirective} ${e.blockedURI}`));
  });
  page.trouble = trouble;
  return page;
}

export async function assertNothingRan(page) {
  assert.equal(await page.evaluate(() => window.__pwned), undefined, 'no injected script ran');
  assert.deepEqual(await page.evaluate(() => window.__violations), [], 'no CSP violation');
  assert.deepEqual(page.trouble, [], 'no dialog, page error or console error');
}

/** axe-core on the page as it is: fails on a serious or critical violation; returns every violation's id. */
export async function axe(page, label) {
  if (!(await page.evaluate(() => typeof window.axe === 'object'))) await page.evaluate(AXE);
  const result = await page.evaluate(() => window.axe.run(document, { resultTypes: ['violations'] }));
  const bad = result.violations.filter((v) => v.impact === 'serious' || v.impact === 'critical');
  assert.deepEqual(
    bad.map((v) => `${v.id} (${v.impact}): ${v.nodes.map((n) => n.target.join(' ')).join(', ')}`),
    [],
    `axe on ${label}`,
  );
  return result.violations.map((v) => `${v.id} (${v.impact})`);
}

/** Opens the dashboard view `name` from the navigation and waits for its heading. */
export async function view(page, name) {
  await page.getByRole('link', { name, exact: true }).click();
  await page.getByRole('heading', { level: 1, name }).waitFor();
}

/** Waits for `locator`; on failure says what the page showed instead. */
export async function shown(page, locator, timeout = 15000) {
  try {
    await locator.waitFor({ timeout });
  } catch (e) {
    throw new Error(`${e.message}\npage: ${await page.locator('main').textContent()}`);
  }
  return locator;
}
