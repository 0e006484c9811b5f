// Validate ScaledObjects (a JSON array on stdin) with KEDA's models: prints one line per
// problem ("index: path message") and exits 1 when there is any.
import { ScaledObject } from "@kubernetes-models/keda/keda.sh/v1alpha1/ScaledObject";

const input = JSON.parse(await new Promise((resolve) => {
  let text = "";
  process.stdin.on("data", (chunk) => { text += chunk; });
  process.stdin.on("end", () => resolve(text));
}));
let failed = false;
input.forEach((document, index) => {
  try {
    new ScaledObject(document).validate();
  } catch (error) {
    failed = true;
    console.log(`${index}: ${error.message}`);
  }
});
process.exit(failed ? 1 : 0);
