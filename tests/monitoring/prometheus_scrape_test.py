#!/usr/bin/python3
"""A real Prometheus scrapes a real dgmm-server under a short load, and every
expression of docker/grafana/dgmm-dashboard.json and
docker/prometheus/dgmm-alerts.yml returns data through its HTTP API.

1. dgmm-server (CPU backend, --metrics_listen on an ephemeral port,
   --max_dim=1000 so that a 1500-row job is refused as too large).
2. /usr/bin/prometheus with a temporary configuration (1 s scrape and rule
   evaluation, the rules file loaded as it is) and storage directory, on a
   free loopback port; the test waits until it has scraped the server once.
3. The load, through dgmm-cli: small jobs, striped jobs, and jobs refused
   with RESOURCE_EXHAUSTED (too_large).
4. It waits until Prometheus's latest sample of the job counters equals what
   the server itself reports, then queries: the counters by value, the rules
   loaded and healthy, and every dashboard and rule expression
   (check_monitoring.py extracts them) for a non-empty result, polling each
   until it has one or a deadline passes.

Nothing depends on timing but the deadlines of the polls. Exits 77 (ctest's
skip) only when prometheus is not installed (scripts/install-deps.sh
installs Debian's). Environment: DGMM_SERVER_BIN, DGMM_CLI_BIN,
DGMM_PROMETHEUS (default /usr/bin/prometheus).
"""
import json
import os
import pathlib
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.error
import urllib.parse
import urllib.request

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))
sys.path.insert(0, str(HERE))
import check_monitoring  # noqa: E402
from dgmm_server import ServerProcess  # noqa: E402

PROMETHEUS = os.environ.get("DGMM_PROMETHEUS") or shutil.which("prometheus") or "/usr/bin/prometheus"
CLI = os.environ.get("DGMM_CLI_BIN")
SMALL_JOBS = 12
STRIPED_JOBS = 2
TOO_LARGE_JOBS = 3
POLL_S = 90


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.status, r.read().decode()


def wait_for(what, fn, timeout=POLL_S, interval=0.25):
    """fn() until it returns something true; that value, or AssertionError."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = fn()
            if last:
                return last
        except (OSError, ValueError, KeyError) as e:  # not up yet
            last = e
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what} (last: {last!r})")


class Prometheus:
    """/usr/bin/prometheus on a free loopback port, scraping `target` every
    second and evaluating `rules` as often."""

    def __init__(self, target, rules, work):
        self.work = pathlib.Path(work)
        config = self.work / "prometheus.yml"
        config.write_text(json.dumps({  # JSON is YAML
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
            "rule_files": [str(rules)],
            "scrape_configs": [{"job_name": "dgmm", "static_configs": [{"targets": [target]}]}],
        }))
        for attempt in range(3):  # the port may be taken between free_port() and the bind
            self.port = free_port()
            self.log_path = self.work / f"prometheus-{attempt}.log"
            self.log = open(self.log_path, "wb")
            self.process = subprocess.Popen(
                [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={self.work / 'data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
                stdout=self.log, stderr=subprocess.STDOUT)
            try:
                wait_for("prometheus ready", self.ready, timeout=60)
                return
            except AssertionError:
                if self.process.poll() is None:
                    raise AssertionError("prometheus did not get ready:\n" + self.log_text())
                self.log.close()
        raise AssertionError("prometheus did not start:\n" + self.log_text())

    def ready(self):
        if self.process.poll() is not None:
            raise AssertionError("prometheus exited")
        return http_get(f"http://127.0.0.1:{self.port}/-/ready")[0] == 200

    def log_text(self):
        return self.log_path.read_text(errors="replace")

    def api(self, path, **params):
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}?" + urllib.parse.urlencode(params)
        try:
            body = http_get(url)[1]
        except urllib.error.HTTPError as e:  # a bad query: 400 with the error in JSON
            body = e.read().decode()
        reply = json.loads(body)
        if reply.get("status") != "success":
            raise AssertionError(f"{path} {params}: {reply.get('errorType')}: {reply.get('error')}")
        return reply["data"]

    def query(self, expr):
        return self.api("query", query=expr)["result"]

    def value(self, expr):
        """The single sample's value of an instant query, or None."""
        r = self.query(expr)
        return float(r[0]["value"][1]) if len(r) == 1 else None

    def stop(self):
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()


def scrape(port):
    """{series: value} of the server's own /metrics."""
    out = {}
    for line in http_get(f"http://127.0.0.1:{port}/metrics")[1].splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def total(metrics, name):
    return sum(v for k, v in metrics.items() if k == name or k.startswith(name + "{"))


class PrometheusScrape(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.work = tempfile.TemporaryDirectory(prefix="dgmm-prometheus-")
        cls.server = ServerProcess(flags=["--metrics_listen=127.0.0.1:0", "--max_dim=1000", "--threads=2"])
        m = re.search(r"/metrics \(port (\d+)\)", cls.server.log())
        if not m:
            cls.server.stop()
            raise AssertionError("no metrics port in the server's log:\n" + cls.server.log())
        cls.metrics_port = int(m.group(1))
        cls.target = f"127.0.0.1:{cls.metrics_port}"
        try:
            cls.prom = Prometheus(cls.target, check_monitoring.RULES, cls.work.name)
        except BaseException:
            cls.server.stop()
            raise
        # One scrape before the load, so that rates span it.
        wait_for("the first scrape", lambda: cls.prom.value(f'up{{instance="{cls.target}"}}') == 1)
        wait_for("dgmm's series", lambda: cls.prom.query("dgmm_jobs_completed_total"))
        cls.run_load()
        # Prometheus has the final counts once its latest samples equal the server's.
        final = scrape(cls.metrics_port)
        cls.completed = total(final, "dgmm_jobs_completed_total")
        cls.failed = total(final, "dgmm_jobs_failed_total")
        wait_for("the load's last scrape", lambda: (
            cls.prom.value("sum(dgmm_jobs_completed_total)") == cls.completed
            and cls.prom.value("sum(dgmm_jobs_failed_total)") == cls.failed))

    @classmethod
    def run_load(cls):
        def cli(*args):
            return subprocess.run([CLI, "multiply", "--server", cls.server.address, *args],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
        for i in range(SMALL_JOBS):
            p = cli("--random", str(8 + 8 * i), "--check", "--seed", str(i))
            assert p.returncode == 0, p.stdout
        for i in range(STRIPED_JOBS):
            p = cli("--random", "300", "--stripes", "2", "--check")
            assert p.returncode == 0, p.stdout
        for i in range(TOO_LARGE_JOBS):
            p = cli("--random", "1500", "--cols", "10", "--stripes", "1")
            assert p.returncode != 0 and "RESOURCE_EXHAUSTED" in p.stdout, p.stdout

    @classmethod
    def tearDownClass(cls):
        cls.prom.stop()
        cls.server.stop()
        cls.work.cleanup()

    def test_counters_reach_prometheus_as_the_server_counts_them(self):
        self.assertGreaterEqual(self.completed, SMALL_JOBS + 2 * STRIPED_JOBS)
        self.assertEqual(self.failed, TOO_LARGE_JOBS)
        t = f'instance="{self.target}",device="cpu"'
        self.assertEqual(self.prom.value(f'dgmm_jobs_failed_total{{{t},code="RESOURCE_EXHAUSTED"}}'), TOO_LARGE_JOBS)
        self.assertEqual(self.prom.value(f'dgmm_jobs_rejected_total{{{t},reason="too_large"}}'), TOO_LARGE_JOBS)
        self.assertEqual(self.prom.value(f"dgmm_job_queue_seconds_count{{{t}}}"), self.completed)
        self.assertEqual(self.prom.value(f'dgmm_job_transfer_seconds_count{{{t},direction="h2d"}}'), self.completed)
        self.assertGreater(self.prom.value(f"dgmm_job_compute_seconds_sum{{{t}}}"), 0)
        self.assertGreaterEqual(self.prom.value('sum(dgmm_group_parts_total{outcome="completed"})'), 2 * STRIPED_JOBS)
        self.assertEqual(self.prom.value(f"dgmm_budget_reserved_bytes{{{t}}}"), 0)
        self.assertEqual(self.prom.value(f"dgmm_device_in_service{{{t}}}"), 1)
        self.assertEqual(len(self.prom.query("dgmm_build_info")), 1)

    def test_rules_are_loaded_and_evaluate_without_error(self):
        groups = self.prom.api("rules")["groups"]
        names = {r["name"] for g in groups for r in g["rules"]}
        self.assertLessEqual(set(check_monitoring.PROMISED_ALERTS), names)
        wanted = {r.get("alert") or r.get("record") for g in check_monitoring.load_rules()["groups"] for r in g["rules"]}
        self.assertEqual(names, wanted)
        for g in groups:
            for r in g["rules"]:
                # A rule not yet evaluated is "unknown"; wait for its first evaluation.
                self.assertNotEqual(r.get("health"), "err", f"{r['name']}: {r.get('lastError')}")
        wait_for("every rule evaluated", lambda: all(
            r.get("health") == "ok" for g in self.prom.api("rules")["groups"] for r in g["rules"]))

    def test_every_rule_expression_returns_data(self):
        self.assert_all_return_data(check_monitoring.rule_exprs())

    def test_every_dashboard_expression_returns_data(self):
        exprs = check_monitoring.dashboard_exprs()
        self.assertGreaterEqual(len(exprs), 15)
        self.assert_all_return_data(exprs)

    def assert_all_return_data(self, exprs):
        missing = {}
        pending = dict(exprs)
        # Recording rules' series appear at their first evaluation after the
        # load: poll until each expression has data or the deadline passes.
        deadline = time.monotonic() + POLL_S
        while pending and time.monotonic() < deadline:
            for where, expr in list(pending.items()):
                if self.prom.query(expr):
                    del pending[where]
            if pending:
                time.sleep(0.5)
        missing = {where: expr for where, expr in pending.items()}
        self.assertEqual(missing, {}, "expressions without data")
        print(f"{len(exprs)} expressions returned data", file=sys.stderr)


if __name__ == "__main__":
    if not os.access(PROMETHEUS, os.X_OK):
        print(f"SKIP: no prometheus at {PROMETHEUS} (scripts/install-deps.sh installs Debian's)")
        sys.exit(77)
    if not CLI or not os.access(CLI, os.X_OK):
        print("set DGMM_CLI_BIN to the built dgmm-cli", file=sys.stderr)
        sys.exit(2)
    unittest.main()
