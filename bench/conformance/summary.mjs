// Counts a cache-tests results file with the suite's own accounting: determineTestResult from the checked-out
// suite, so a test whose dependency (transitively) fails counts as dependency_fail, not as passed.
// Usage: node summary.mjs <suite checkout> <results.json> [--list]
import fs from 'fs'
import path from 'path'
import { pathToFileURL } from 'url'

const [suiteDir, resultsFile, list] = process.argv.slice(2)
const load = rel => import(pathToFileURL(path.resolve(suiteDir, rel)).href)
const tests = (await load('tests/index.mjs')).default
const { determineTestResult, resultTypes } = await load('test-engine/lib/results.mjs')
const results = JSON.parse(fs.readFileSync(resultsFile))

const name = Object.fromEntries(Object.entries(resultTypes).map(([k, v]) => [v[2], k]))
const counts = {}
const raw = {}
const misses = []
for (const suite of tests) {
  for (const t of suite.tests) {
    if (t.browser_only) continue
    const kind = t.kind || 'required'
    const result = determineTestResult(tests, t.id, results)
    const passed = result === resultTypes.pass || result === resultTypes.yes
    counts[kind] ??= [0, 0]
    counts[kind][1]++
    if (passed) counts[kind][0]++
    raw[kind] ??= 0
    if (results[t.id] === true) raw[kind]++
    if (!passed && kind !== 'check') {
      let why = name[result[2]]
      if (result === resultTypes.dependency_fail) {
        const failing = t.depends_on.filter(d => {
          const r = determineTestResult(tests, d, results)
          return r !== resultTypes.pass && r !== resultTypes.yes
        })
        why += ` (${failing.join(', ')})`
      } else if (results[t.id] !== undefined && results[t.id] !== true) {
        why += ` ${JSON.stringify(results[t.id])}`
      }
      misses.push([kind, suite.id, t.id, why])
    }
  }
}
const fmt = k => counts[k] ? `${counts[k][0]}/${counts[k][1]}` : '0/0'
console.log(`required: ${fmt('required')} passed; optimal: ${fmt('optimal')} passed; check: ${fmt('check')} yes` +
  ' (dependency accounting)')
console.log(`without dependencies: required ${raw.required ?? 0}, optimal ${raw.optimal ?? 0}, check ${raw.check ?? 0}`)
if (list) for (const m of misses) console.log(m.join('  '))
