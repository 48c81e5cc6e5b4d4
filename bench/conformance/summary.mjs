import tests from 'http-cache-tests/tests/index.mjs'
import fs from 'fs'
const results = JSON.parse(fs.readFileSync(process.argv[2]))
let req = 0, pass = 0, fails = []
let opt = 0, optPass = 0
for (const suite of tests) {
  for (const t of suite.tests) {
    if (t.browser_only) continue
    const kind = t.kind || 'required'
    const r = results[t.id]
    if (kind === 'required') { req++; if (r === true) pass++; else fails.push([suite.id, t.id, JSON.stringify(r)]) }
    else if (kind === 'optimal') { opt++; if (r === true) optPass++ }
  }
}
console.log(`required: ${pass}/${req} passed; optimal: ${optPass}/${opt}`)
if (process.argv[3]) for (const f of fails) console.log(f.join('  '))
