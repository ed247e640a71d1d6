/** The package version; the User-Agent names it (a test checks it equals package.json). */
export const VERSION = '0.3.0';
