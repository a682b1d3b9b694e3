#!/usr/bin/env python3
"""Adds the peer's figures (../shared/peers/hf_grpo_step.py JSON output) and
the ratios to our benchmark result files (format: CONTRIBUTING.md).

Usage: merge_peer.py PEER_JSON OUR_JSON [OUR_JSON ...]
rollout results get ratio tokens_per_s / hf_generate_tok_s; train results
get torch_train_s / seconds; step results get step_s / seconds.
"""
import json, sys

def main():
    peer = json.load(open(sys.argv[1]))
    for path in sys.argv[2:]:
        r = json.load(open(path))
        m = r["metrics"]
        r["peer"] = {"name": "pytorch+transformers (shared/peers/hf_grpo_step.py)", "metrics": peer}
        ratios = {}
        if r["bench"] == "rollout":
            ratios["speedup_vs_hf_generate"] = m["tokens_per_s"] / peer["hf_generate_tok_s"]
            ratios["ratio_to_floor"] = m.get("ratio_to_floor")
        elif r["bench"] == "train_step":
            ratios["speedup_vs_torch_train"] = peer["torch_train_s"] / m["seconds"]
        elif r["bench"] == "grpo_step":
            ratios["speedup_vs_peer_step"] = peer["step_s"] / m["seconds"]
        r["ratios"] = ratios
        json.dump(r, open(path, "w"), indent=2)
        print(path, json.dumps(ratios))

if __name__ == "__main__":
    main()
