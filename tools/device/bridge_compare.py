# Comparison of two servers' first-position top-k logprobs, for the weight-bridge
# checks (tools/device/ipc_bridge_test.sh). Exact text equality of greedy answers is
# not a sound test of "same weights": the trainer's [server] batches a request with
# the loop's rollouts, so its GEMM/attention kernels differ from the attached
# server's, and bf16 rounding then flips greedy picks among near-equal logits.
# Comparing the first generated position's logprobs (same prefix on both sides)
# within a bf16 tolerance is sound both ways: equal weights pass, and weights that
# moved by more than the tolerance fail (see distance()).
# Stdlib only; tools/device/test_bridge_compare.py checks it on canned responses.

# Tolerances on |delta logprob|. bf16 keeps 8 significant bits: one rounding moves a
# value by at most 2^-8 of its magnitude, so a logit of magnitude <= 12.8 moves by
# <= 0.05, and the log-softmax (f32) adds at most the same error of its max logit.
# Two kernel paths that round differently through a few layers stay within that for
# the tiny model; the 24-layer random-init presets accumulate more roundings in the
# residual stream, hence twice the bound.
TOL_TINY = 0.05
TOL_DEEP = 0.1


class BadAnswer(ValueError):
    """A response that lacks what was asked for (not a transport error)."""


def first_top(response):
    """{token text: logprob} of the first generated position of a /v1/completions
    response requested with "logprobs": k. Raises BadAnswer naming what is missing."""
    try:
        lp = response["choices"][0]["logprobs"]
    except (KeyError, IndexError, TypeError):
        raise BadAnswer("response has no choices[0].logprobs; request it with \"logprobs\": 5")
    if not lp or not lp.get("top_logprobs"):
        raise BadAnswer("response logprobs has no top_logprobs (empty completion, or logprobs not requested)")
    top = lp["top_logprobs"][0]
    if not isinstance(top, dict) or not top:
        raise BadAnswer("top_logprobs[0] is not a non-empty {token: logprob} object")
    return {str(k): float(v) for k, v in top.items()}


def distance(a, b):
    """A lower bound on max |logprob_a(t) - logprob_b(t)| over tokens t of either list.
    A token in both lists contributes its exact difference. A token in only one list
    (say a) is, in b, at most b's smallest listed logprob, so it contributes
    max(0, a(t) - min(b)); the bound never exceeds the true difference, so a
    distance above the tolerance is a real difference."""
    d = 0.0
    for t in set(a) | set(b):
        if t in a and t in b:
            d = max(d, abs(a[t] - b[t]))
        elif t in a:
            d = max(d, a[t] - min(b.values()))
        else:
            d = max(d, b[t] - min(a.values()))
    return d


def argmax(top):
    return max(top.items(), key=lambda kv: (kv[1], kv[0]))[0]


def margin(top):
    """Top-1 minus top-2 logprob (infinite with a single entry)."""
    v = sorted(top.values(), reverse=True)
    return v[0] - v[1] if len(v) > 1 else float("inf")


def compare_first(trainer, attached, tol):
    """Same-version check of one pair of first-position top-k dicts. Returns
    (ok, reason): ok when every logprob agrees within tol (distance) and the argmax
    is the same unless the trainer's top-2 margin is below tol (a near tie that
    rounding may break either way)."""
    d = distance(trainer, attached)
    if d > tol:
        return False, f"logprobs differ by {d:.4f} > tolerance {tol}"
    ta, sa = argmax(trainer), argmax(attached)
    if ta != sa and margin(trainer) >= tol:
        return False, f"argmax {ta!r} vs {sa!r} with trainer top-2 margin {margin(trainer):.4f} >= tolerance {tol}"
    return True, f"max |delta| {d:.4f}"


def weights_moved(first, last, tol):
    """The check's power: the attached server's first-position top-k at its first
    and at its last version differ by more than tol."""
    return distance(first, last) > tol
