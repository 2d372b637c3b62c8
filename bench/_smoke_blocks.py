"""Scratch: two chats on one document, the second should restore the document's blocks."""
import logging, random, tempfile, time
from pathlib import Path
logging.basicConfig(level=logging.INFO, format="%(name)s %(message)s")
from engine.api import Hearth, resolve_paths
from engine.types import TurnRequest, Finished, SamplingParams

real = Path("/work/main/.test-cache/home")
home = Path(tempfile.mkdtemp()) / "h"; home.mkdir()
for sub in ("models", "converted"):
    (home / sub).symlink_to(real / sub)
paths = resolve_paths(home).ensure()
h = Hearth(paths, provider="cpu"); h.load()
rng = random.Random(1)
words = "the of and a to in is was he for it with as his on be at by had are but from or have an they which one you were all".split()
doc = " ".join(rng.choice(words) + ("." if rng.random() < 0.08 else "") for _ in range(2400))
def turn(cid, q):
    ev = []
    t = time.perf_counter()
    h.run_turn(TurnRequest(cid, doc + "\n\n" + q, params=SamplingParams(temperature=0), max_new_tokens=8), ev.append, create=True)
    fin = [e for e in ev if isinstance(e, Finished)][0]
    st = h.checkpoints
    print(cid, "resume", fin.local.resume if fin.local else None)
    print("  total", st.total_bytes(), "stats", st.stats(), "%.2fs" % (time.perf_counter() - t), repr(fin.text if hasattr(fin,'text') else ''))
    return fin
if __name__ != "__main__":
    raise SystemExit
turn("c1", "What is the first word?")
turn("c2", "How many sentences are there?")
turn("c2", "And the last word?")
print(h.checkpoints.shares())
h.close()
