"""The previous implementation (lance-context 0.6.7): add_many of 1,000 new
records vs upsert_many of 1,000 records replacing stored ones by external_id,
interleaved, medians. Usage: upsert_ratio.py DIR ROWS REPEATS"""
import shutil, statistics, sys, time
from lance_context import Context

d, rows, repeats = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
shutil.rmtree(d, ignore_errors=True)
ctx = Context.create(d)

def recs(prefix, start, n, ext=None):
    return [
        {"role": "user", "content": f"record {i}: some context text for the agent",
         "external_id": ext(i) if ext else f"ext-{prefix}{i:010}", "run_id": f"run-{i // 1000}"}
        for i in range(start, start + n)
    ]

t = time.time()
batch = 10_000
for s in range(0, rows, batch):
    ctx.add_many(recs("r", s, min(batch, rows - s)))
print(f"load {rows} rows in {time.time() - t:.1f}s", flush=True)
adds, ups = [], []
for i in range(repeats):
    first = i * 1000
    t = time.perf_counter(); ctx.add_many(recs(f"a{i}-", 0, 1000)); adds.append(time.perf_counter() - t)
    up = recs("u", 0, 1000, ext=lambda j, f=first: f"ext-r{((f + j) * 7) % rows:010}")
    t = time.perf_counter(); out = ctx.upsert_many(up); ups.append(time.perf_counter() - t)
    assert all(not o["inserted"] for o in out), "every upsert replaces a stored record"
a, u = statistics.median(adds) * 1e3, statistics.median(ups) * 1e3
print(f"add_many 1000: {a:.1f} ms | upsert_many 1000 (replacing): {u:.1f} ms | ratio {u / a:.2f}")
