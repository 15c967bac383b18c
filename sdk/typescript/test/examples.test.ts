// The examples (sdk/typescript/examples) run as programs and print what their
// "// Output:" comment says, as Go's testable examples: they use the test kit
// (@quotaplane/client/testing), no api.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { readdirSync, readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { describe, it } from "node:test";

const here = dirname(fileURLToPath(import.meta.url)); // build/test
const sources = join(here, "..", "..", "examples");
const built = join(here, "..", "examples");

describe("examples", () => {
  const files = readdirSync(sources).filter((f) => f.endsWith(".ts"));
  it("there are examples", () => assert.ok(files.length >= 3, files.join(", ")));
  for (const file of files) {
    it(`${file} prints its // Output:`, () => {
      const src = readFileSync(join(sources, file), "utf8");
      const at = src.lastIndexOf("\n// Output:\n");
      assert.ok(at >= 0, `${file} has no "// Output:" comment`);
      const want = src
        .slice(at + "\n// Output:\n".length)
        .trimEnd()
        .split("\n")
        .map((l) => l.replace(/^\/\/ ?/, ""));
      const got = execFileSync(process.execPath, [join(built, file.replace(/\.ts$/, ".js"))], { encoding: "utf8", timeout: 20_000 }).trimEnd().split("\n");
      assert.deepEqual(got, want);
    });
  }
});
