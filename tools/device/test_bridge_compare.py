# Checks bridge_compare.py on canned /v1/completions responses (no server, no GPU):
#   python3 tools/device/test_bridge_compare.py
# The expected verdicts are worked out by hand from the numbers below.
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bridge_compare as bc  # noqa: E402


def response(top):
    """A completion response shaped like grpo serve's (OpenAI legacy logprobs)."""
    return {"choices": [{"text": "5", "logprobs": {"tokens": ["5"], "token_logprobs": [max(top.values())],
                                                   "top_logprobs": [top], "text_offset": [0]}}],
            "policy_version": 17}


BASE = {"5": -0.50, "<": -1.20, ">": -2.00, "3": -3.10, "7": -3.50}


class FirstTop(unittest.TestCase):
    def test_reads_first_position(self):
        self.assertEqual(bc.first_top(response(BASE)), BASE)

    def test_missing_logprobs_is_named(self):
        with self.assertRaisesRegex(ValueError, "logprobs"):
            bc.first_top({"choices": [{"text": "5", "logprobs": None}]})
        with self.assertRaisesRegex(ValueError, "choices"):
            bc.first_top({"error": {"message": "x"}})


class Compare(unittest.TestCase):
    def test_bf16_noise_passes(self):
        t = dict(BASE)
        a = {"5": -0.53, "<": -1.17, ">": -2.04, "3": -3.08, "7": -3.46}
        ok, why = bc.compare_first(t, a, 0.05)
        self.assertTrue(ok, why)

    def test_shift_above_tolerance_fails(self):
        a = dict(BASE, **{"<": -1.30})  # 0.10 away
        ok, why = bc.compare_first(BASE, a, 0.05)
        self.assertFalse(ok)
        self.assertIn("0.1000", why)

    def test_near_tie_may_flip_argmax(self):
        t = {"5": -0.70, ">": -0.72, "<": -2.0}
        a = {"5": -0.71, ">": -0.70, "<": -2.0}  # argmax flips; margin 0.02 < tol
        self.assertTrue(bc.compare_first(t, a, 0.05)[0])

    def test_clear_argmax_flip_fails(self):
        t = {"5": -0.50, ">": -0.58, "<": -2.0}
        a = {"5": -0.54, ">": -0.535, "<": -2.0}  # within tol, but the trainer's margin 0.08 >= tol
        ok, why = bc.compare_first(t, a, 0.05)
        self.assertFalse(ok)
        self.assertIn("argmax", why)

    def test_token_only_in_one_list(self):
        # "9" is absent from the trainer's top-5, so there it is <= -3.50; the attached
        # server lists it at -3.30: at least 0.20 apart.
        a = {"5": -0.50, "<": -1.20, ">": -2.00, "3": -3.10, "9": -3.30}
        self.assertAlmostEqual(bc.distance(BASE, a), 0.20, places=9)
        self.assertFalse(bc.compare_first(BASE, a, 0.05)[0])
        # Listed just above the other's cut: the bound stays within the tolerance.
        a2 = {"5": -0.50, "<": -1.20, ">": -2.00, "3": -3.10, "9": -3.48}
        self.assertTrue(bc.compare_first(BASE, a2, 0.05)[0])


class Moved(unittest.TestCase):
    def test_learned_weights_move(self):
        last = {"5": -0.05, "<": -3.50, ">": -4.00, "3": -6.0, "7": -6.5}
        self.assertTrue(bc.weights_moved(BASE, last, bc.TOL_TINY))

    def test_same_weights_do_not(self):
        self.assertFalse(bc.weights_moved(BASE, dict(BASE, **{"5": -0.52}), bc.TOL_TINY))


if __name__ == "__main__":
    unittest.main()
