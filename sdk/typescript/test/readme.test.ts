// The "TypeScript client" section of docs/TOUR.md (the tour of the API): its blocks type-check against this
// package; its install commands, run as printed in a fresh npm project, install the package there, and the first
// block runs in that project, as printed, against a real api with the demo org.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { cpSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { delimiter, dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { after, before, describe, it } from "node:test";

import ts from "typescript";

import { repoRoot, Stack } from "./harness.js";

const pkgRoot = join(dirname(fileURLToPath(import.meta.url)), "..", "..");

/** docs/TOUR.md's "### TypeScript client" section. */
function section(): string {
  const readme = readFileSync(join(repoRoot, "docs", "TOUR.md"), "utf8");
  const start = readme.indexOf("\n### TypeScript client\n");
  assert.ok(start >= 0, "docs/TOUR.md has no \"### TypeScript client\" section");
  const rest = readme.slice(start + 1);
  const end = rest.search(/\n##+ /);
  return end < 0 ? rest : rest.slice(0, end);
}

/** The ```ts blocks of the section. */
function snippets(): string[] {
  return [...section().matchAll(/```ts\n([\s\S]*?)```/g)].map((m) => m[1]!);
}

/** The section's ```sh block: how to install the package. */
function installCommands(): string {
  const blocks = [...section().matchAll(/```sh\n([\s\S]*?)```/g)].map((m) => m[1]!);
  assert.equal(blocks.length, 1, "the section has one ```sh block, the install commands");
  return blocks[0]!;
}

/**
 * A newcomer's environment: this process's, without what `npm test` adds to it (npm_*
 * variables, the SDK's node_modules/.bin on PATH).
 */
function newcomerEnv(extra: Record<string, string>): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = {};
  for (const [k, v] of Object.entries(process.env)) if (!/^npm_/i.test(k) && k !== "INIT_CWD" && k !== "NODE_OPTIONS") env[k] = v;
  env.PATH = (env.PATH ?? "").split(delimiter).filter((p) => !p.includes("node_modules")).join(delimiter);
  return { ...env, ...extra };
}

// What the blocks leave to the reader.
const prelude = "declare function callModel(input: unknown): Promise<{ tokens: number }>;\n";

describe("docs/TOUR.md, TypeScript client", () => {
  let stack: Stack;
  before(async () => {
    stack = await Stack.start({ demoRedisDB: 13 });
  });
  after(async () => {
    await stack?.stop();
  });

  it("type-checks every block against the package", () => {
    const blocks = snippets();
    assert.ok(blocks.length >= 2, `${blocks.length} blocks`);
    const dir = join(pkgRoot, "build", "readme");
    mkdirSync(dir, { recursive: true });
    const file = join(dir, "snippets.ts");
    writeFileSync(file, prelude + blocks.join("\n").replaceAll(`"@quotaplane/client/testing"`, `"../../src/testing.js"`).replaceAll(`"@quotaplane/client"`, `"../../src/index.js"`));
    const cfg = ts.getParsedCommandLineOfConfigFile(join(pkgRoot, "tsconfig.json"), {}, { ...ts.sys, onUnRecoverableConfigFileDiagnostic: (d) => assert.fail(String(d.messageText)) });
    const program = ts.createProgram([file], { ...cfg!.options, noEmit: true, rootDir: pkgRoot });
    const diags = ts.getPreEmitDiagnostics(program).map((d) => ts.formatDiagnostic(d, { getCanonicalFileName: (f) => f, getCurrentDirectory: () => dir, getNewLine: () => "\n" }));
    assert.deepEqual(diags, []);
  });

  // A copy of the clone's SDK (its files as git has them), the section's install
  // commands run as printed in a fresh npm project, and the first block run there,
  // importing "@quotaplane/client" as printed: the section's way, not the package's
  // own src.
  it("installs the package as the section says into a fresh npm project, where the first block runs as printed", () => {
    const tmp = mkdtempSync(join(tmpdir(), "qp-sdk-readme-"));
    try {
      const clone = join(tmp, "quotaplane");
      const files = execFileSync("git", ["ls-files", "--cached", "--others", "--exclude-standard", "-z", "sdk/typescript"], { cwd: repoRoot, encoding: "utf8" })
        .split("\0")
        .filter((f) => f !== "");
      assert.ok(files.includes("sdk/typescript/package.json"), "git lists the SDK's files");
      for (const f of files) {
        mkdirSync(dirname(join(clone, f)), { recursive: true });
        try {
          cpSync(join(repoRoot, f), join(clone, f));
        } catch (e) {
          if ((e as NodeJS.ErrnoException).code !== "ENOENT") throw e; // deleted, not yet committed
        }
      }
      const app = join(tmp, "app");
      mkdirSync(app);
      const env = newcomerEnv({});
      execFileSync("npm", ["init", "-y"], { cwd: app, env, stdio: "pipe" });
      // The commands as printed, but for the clone's path.
      const commands = installCommands();
      const line = commands.split("\n").find((l) => /^QUOTAPLANE=/.test(l));
      assert.ok(line, "the install commands set QUOTAPLANE to the clone");
      const script = commands.replace(line, `QUOTAPLANE=${clone}`);
      execFileSync("bash", ["-euo", "pipefail", "-c", script], { cwd: app, env, stdio: "pipe", timeout: 300_000 });
      const pkg = JSON.parse(readFileSync(join(app, "package.json"), "utf8")) as { dependencies?: Record<string, string> };
      assert.match(pkg.dependencies?.["@quotaplane/client"] ?? "", /quotaplane-client-0\.1\.0\.tgz$/);
      // Publishable: not private, its changelog and README shipped, the test kit's subpath resolved.
      const installed = join(app, "node_modules", "@quotaplane", "client");
      const manifest = JSON.parse(readFileSync(join(installed, "package.json"), "utf8")) as { private?: boolean };
      assert.equal(manifest.private, undefined);
      for (const f of ["CHANGELOG.md", "README.md", "dist/index.d.ts", "dist/testing.d.ts", "dist/schema.d.ts"]) assert.ok(existsSync(join(installed, f)), `the package lacks ${f}`);
      const kit = execFileSync(process.execPath, ["--input-type=module", "-e", `import { FakeQuotaplane } from "@quotaplane/client/testing"; import { VERSION } from "@quotaplane/client"; console.log(typeof FakeQuotaplane, VERSION)`], { cwd: app, env, encoding: "utf8" });
      assert.equal(kit.trim(), "function 0.1.0");

      // The first block runs as it says, untranspiled: saved as check.mjs, then
      // KEY=<key> node check.mjs (a newcomer on Node.js 20 has no TypeScript loader).
      const [first] = snippets();
      const run = /^\/\/ Save as (\S+\.mjs) in that project and run it: KEY=<the demo org key> node (\S+)$/m.exec(first!.split("\n")[0]!);
      assert.ok(run && run[1] === run[2], `the first block's first line says how to run it: ${first!.split("\n")[0]}`);
      writeFileSync(join(app, run[1]!), first!.replaceAll("http://localhost:8080", stack.baseUrl));
      const out = execFileSync("node", [run[2]!], { cwd: app, env: newcomerEnv({ KEY: stack.demoKey }), encoding: "utf8" });
      const shown = /\/\/ (.*)$/m.exec(first!.split("\n").find((l) => l.startsWith("console.log"))!)![1]!;
      const pattern = new RegExp("^" + shown.split("...").map((p) => p.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")).join("\\d+") + "$");
      assert.match(out.trim(), pattern);
    } finally {
      rmSync(tmp, { recursive: true, force: true });
    }
  });
});
