// The "TypeScript client" blocks of docs/TOUR.md (the tour of the API): both type-check against this package, and
// the first one runs, as printed, against a real api with the demo org.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { after, before, describe, it } from "node:test";

import ts from "typescript";

import { repoRoot, Stack } from "./harness.js";

const pkgRoot = join(dirname(fileURLToPath(import.meta.url)), "..", "..");

/** The ```ts blocks of docs/TOUR.md's "### TypeScript client" section. */
function snippets(): string[] {
  const readme = readFileSync(join(repoRoot, "docs", "TOUR.md"), "utf8");
  const start = readme.indexOf("\n### TypeScript client\n");
  assert.ok(start >= 0, "docs/TOUR.md has no \"### TypeScript client\" section");
  const rest = readme.slice(start + 1);
  const end = rest.search(/\n##+ /);
  const section = end < 0 ? rest : rest.slice(0, end);
  return [...section.matchAll(/```ts\n([\s\S]*?)```/g)].map((m) => m[1]!);
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
    writeFileSync(file, prelude + blocks.join("\n").replaceAll(`"@quotaplane/client"`, `"../../src/index.js"`));
    const cfg = ts.getParsedCommandLineOfConfigFile(join(pkgRoot, "tsconfig.json"), {}, { ...ts.sys, onUnRecoverableConfigFileDiagnostic: (d) => assert.fail(String(d.messageText)) });
    const program = ts.createProgram([file], { ...cfg!.options, noEmit: true, rootDir: pkgRoot });
    const diags = ts.getPreEmitDiagnostics(program).map((d) => ts.formatDiagnostic(d, { getCanonicalFileName: (f) => f, getCurrentDirectory: () => dir, getNewLine: () => "\n" }));
    assert.deepEqual(diags, []);
  });

  it("runs the first block, as printed, against the demo org", () => {
    const [first] = snippets();
    const js = ts.transpileModule(first!.replaceAll(`"@quotaplane/client"`, `"../src/index.js"`).replaceAll("http://localhost:8080", stack.baseUrl), {
      compilerOptions: { module: ts.ModuleKind.ESNext, target: ts.ScriptTarget.ES2022 },
    }).outputText;
    const dir = join(pkgRoot, "build", "readme");
    mkdirSync(dir, { recursive: true });
    writeFileSync(join(dir, "first.mjs"), js);
    const out = execFileSync(process.execPath, [join(dir, "first.mjs")], { env: { ...process.env, KEY: stack.demoKey }, encoding: "utf8" });
    // The block's comment, with ... for the seconds to the reset.
    const shown = /\/\/ (.*)$/m.exec(first!.split("\n").find((l) => l.startsWith("console.log"))!)![1]!;
    const pattern = new RegExp("^" + shown.split("...").map((p) => p.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")).join("\\d+") + "$");
    assert.match(out.trim(), pattern);
  });
});
