// Builds the SDK, its tests and the web app (`npm run build`) when any of
// their sources, the protos or the lock file changed since the last build,
// and does nothing otherwise — so the bundle the edge embeds keeps its
// timestamps and a warm cargo build stays warm.

import { execSync } from "node:child_process";
import { existsSync, readdirSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";

const stamp = "dist/.built";
const sources = ["src", "app", "test", "browser-test", "bench", "../../proto/proto", "package.json", "package-lock.json", "tsconfig.json", "build.mjs"];

function newest(path) {
  if (!existsSync(path)) return 0;
  const s = statSync(path);
  if (!s.isDirectory()) return s.mtimeMs;
  let max = s.mtimeMs;
  for (const entry of readdirSync(path)) {
    if (path === "src" && entry === "gen") continue;
    max = Math.max(max, newest(join(path, entry)));
  }
  return max;
}

const built = existsSync(stamp) ? statSync(stamp).mtimeMs : 0;
if (Math.max(...sources.map(newest)) > built || process.argv.includes("--force")) {
  console.log("clients/web: building the SDK and the web app");
  execSync("npm run build", { stdio: "inherit" });
  writeFileSync(stamp, new Date().toISOString() + "\n");
} else {
  console.log("clients/web: up to date");
}
