// Validates Prometheus Operator resources (a JSON list on stdin) against the operator's own
// CRD schemas, as published in the npm package @kubernetes-models/prometheus-operator (its
// validators are compiled from the CRDs' openAPIV3Schema). argv[2]: the node_modules folder
// the package is installed in. Prints a JSON list of errors; exits 1 when there are any.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const models = join(process.argv[2], "@kubernetes-models", "prometheus-operator", "monitoring.coreos.com", "v1");
const manifests = JSON.parse(readFileSync(0, "utf8"));
const errors = [];
for (const manifest of manifests) {
  const name = `${manifest.kind}/${manifest.metadata?.name}`;
  let model;
  try {
    model = await import(pathToFileURL(join(models, `${manifest.kind}.js`)).href);
  } catch (error) {
    errors.push(`${name}: no schema for this kind (${error.message})`);
    continue;
  }
  try {
    new model[manifest.kind](manifest).validate();
  } catch (error) {
    errors.push(`${name}: ${error.message}`);
  }
}
console.log(JSON.stringify(errors));
process.exit(errors.length ? 1 : 0);
