# Atropos's GET /status-env with a JSON body, as aiohttp sends it (Content-Length,
# kept-alive connection), against `grpo api`: Python's http.client sends the GET
# with its body and then another request on the same socket; both must be answered
# and the socket must stay the same. Needs GRPO_BIN (the grpo binary).
import http.client
import json
import os
import re
import subprocess
import time
import unittest


class StatusEnvBody(unittest.TestCase):
    def setUp(self):
        self.proc = subprocess.Popen([os.environ["GRPO_BIN"], "api", "--host", "127.0.0.1", "--port", "0"],
                                     stderr=subprocess.PIPE, text=True)
        seen, m = "", None
        for _ in range(50):
            line = self.proc.stderr.readline()
            seen += line
            m = re.search(r"trajectory API on http://127\.0\.0\.1:(\d+)", line)
            if m or not line:
                break
        self.assertIsNotNone(m, "grpo api did not print its address: " + seen)
        self.port = int(m.group(1))

    def tearDown(self):
        self.proc.terminate()
        self.proc.wait(timeout=20)
        self.proc.stderr.close()

    def call(self, conn, method, path, body=None):
        headers = {"Content-Type": "application/json"} if body is not None else {}
        conn.request(method, path, body=None if body is None else json.dumps(body), headers=headers)
        r = conn.getresponse()
        return r.status, json.loads(r.read() or b"null")

    def test_get_with_json_body_then_another_request_on_the_same_connection(self):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=20)
        reg = {"batch_size": 2, "max_token_len": 64, "checkpoint_dir": "/tmp/c", "save_checkpoint_interval": 1,
               "starting_step": 0, "num_steps": 5}
        self.assertEqual(self.call(c, "POST", "/register", reg)[0], 200)
        self.call(c, "GET", "/batch")
        st, env = self.call(c, "POST", "/register-env", {"max_token_length": 64, "desired_name": "py",
                                                         "weight": 1.0, "group_size": 2, "min_batch_allocation": None})
        self.assertEqual(st, 200)
        group = {"tokens": [[1, 2], [1, 3]], "masks": [[-100, 2], [-100, 3]], "scores": [0.0, 1.0],
                 "env_id": env["env_id"]}
        self.assertEqual(self.call(c, "POST", "/scored_data", group)[0], 200)
        sock = c.sock
        st, se = self.call(c, "GET", "/status-env", {"env_id": env["env_id"]})
        self.assertEqual(st, 200, se)
        self.assertEqual(se["self_queue_size"], 1)
        st, s = self.call(c, "GET", "/status")
        self.assertEqual((st, s), (200, {"current_step": 0, "queue_size": 1}))
        self.assertIs(c.sock, sock, "the server closed the kept-alive connection")
        c.close()


if __name__ == "__main__":
    unittest.main()
