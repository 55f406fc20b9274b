// Validates Kubernetes objects against the API's OpenAPI schemas, as bundled
// in the kubernetes-models package (types, required fields, enums, formats).
//
//   node k8s_schema.mjs NODE_MODULES_DIR < objects.json
//
// objects.json: [{"file": "deployment.yaml", "object": {...}}, ...]. Prints a
// line per problem and exits 1 if any; exits 2 when the validator itself does
// not reject a known-bad object (so that a broken install cannot pass).
import { readFileSync } from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";

const modules = process.argv[2];
if (!modules) {
  console.error("usage: node k8s_schema.mjs NODE_MODULES_DIR < objects.json");
  process.exit(2);
}

// apps/v1 + Deployment -> kubernetes-models/apps/v1/Deployment.js; v1 (core) -> v1/.
async function modelFor(apiVersion, kind) {
  const dir = apiVersion.includes("/") ? apiVersion : `v1`;
  const file = path.join(modules, "kubernetes-models", dir, `${kind}.js`);
  const mod = await import(pathToFileURL(file).href);
  return mod[kind];
}

function problemsOf(Model, object) {
  try {
    new Model(object).validate();
    return [];
  } catch (e) {
    return [String(e.message || e)];
  }
}

const knownBad = {
  apiVersion: "apps/v1",
  kind: "Deployment",
  metadata: { name: "bad" },
  spec: {
    selector: { matchLabels: { a: "b" } },
    template: {
      metadata: { labels: { a: "b" } },
      spec: { containers: [{ name: "c", image: "i", readinessProbe: { grpc: { port: "50051" } } }] },
    },
  },
};
if (problemsOf(await modelFor("apps/v1", "Deployment"), knownBad).length === 0) {
  console.error("k8s_schema: the validator accepted a Deployment with a string gRPC probe port");
  process.exit(2);
}

const entries = JSON.parse(readFileSync(0, "utf8"));
let failures = 0;
for (const { file, object } of entries) {
  const label = `${file}: ${object.kind}/${object.metadata?.name}`;
  let Model;
  try {
    Model = await modelFor(object.apiVersion, object.kind);
  } catch (e) {
    console.log(`${label}: no schema for ${object.apiVersion} ${object.kind}`);
    failures++;
    continue;
  }
  const problems = problemsOf(Model, object);
  for (const p of problems) console.log(`${label}: ${p}`);
  failures += problems.length;
  if (problems.length === 0) console.log(`${label}: valid`);
}
process.exit(failures ? 1 : 0);
