"""Short conversations that checkpoint tests replay turn by turn."""

from engine.sampling import SamplingParams

GREEDY = SamplingParams.greedy_params()
SYSTEM = {"role": "system", "content": "You are a careful assistant. Answer briefly."}
TURN1 = [SYSTEM, {"role": "user", "content": "first question here"}]
TURN2 = TURN1 + [{"role": "assistant", "content": "first answer"}, {"role": "user", "content": "second one"}]
TURN3 = TURN2 + [{"role": "assistant", "content": "second answer"}, {"role": "user", "content": "third"}]
