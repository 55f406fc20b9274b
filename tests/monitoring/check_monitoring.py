#!/usr/bin/python3
"""The monitoring artifacts of docker/ against each other, and the PromQL they
hold, for prometheus_scrape_test.py:

- docker/grafana/dgmm-dashboard.json: every panel's queries, its template
  variables (`instance`, `device`, the data source), dgmm series only;
- docker/prometheus/dgmm-alerts.yml: the four alerts the operations doc
  promises (failure ratio, RESOURCE_EXHAUSTED, p95 queue time, memory
  headroom), each with a `for`, a severity and a summary;
- docker/k8s-monitoring/prometheusrule.yaml: the same groups, as they are
  (`--write` rewrites it from the rules file);
- docker/compose.monitoring.yaml and docker/prometheus/prometheus.yml: the
  files they mount exist, the rules file is loaded, every dgmm service of
  docker/compose.yaml is scraped on its metrics port.

    check_monitoring.py            run the checks (unittest)
    check_monitoring.py --write    rewrite prometheusrule.yaml

Runs with Debian's /usr/bin/python3 (python3-yaml); no network, no build.
"""
import json
import pathlib
import re
import sys
import unittest

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
DASHBOARD = DOCKER / "grafana" / "dgmm-dashboard.json"
RULES = DOCKER / "prometheus" / "dgmm-alerts.yml"
PROMETHEUS_YML = DOCKER / "prometheus" / "prometheus.yml"
COMPOSE = DOCKER / "compose.yaml"
COMPOSE_MONITORING = DOCKER / "compose.monitoring.yaml"
K8S_MONITORING = DOCKER / "k8s-monitoring"
PROMETHEUS_RULE = K8S_MONITORING / "prometheusrule.yaml"
METRICS_PORT = 9464

# What each alert the docs promise watches: a series its expression (or the
# recording rule it reads) must name.
PROMISED_ALERTS = {
    "DgmmHighFailureRatio": "dgmm_jobs_failed_total",
    "DgmmResourceExhausted": 'code="RESOURCE_EXHAUSTED"',
    "DgmmQueueTimeHigh": "dgmm_job_queue_seconds_bucket",
    "DgmmMemoryHeadroomLow": "dgmm_budget_reserved_bytes",
}

# Grafana's interval variables, and the value a test query gives them: long
# enough to hold every sample of a test run.
GRAFANA_INTERVALS = ("$__rate_interval", "$__interval", "$__range")
TEST_RANGE = "1h"

PROMETHEUS_RULE_HEADER = """\
# Generated from docker/prometheus/dgmm-alerts.yml by
# tests/monitoring/check_monitoring.py --write; edit that file, not this one.
# For the Prometheus Operator; plain Prometheus loads the rules file itself.
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: dgmm
  labels:
    app.kubernetes.io/name: dgmm
    app.kubernetes.io/component: server
spec:
"""


def load_dashboard():
    return json.loads(DASHBOARD.read_text(encoding="utf-8"))


def load_rules():
    return yaml.safe_load(RULES.read_text(encoding="utf-8"))


def panels(dashboard):
    """Every panel, those inside rows too."""
    out = []
    for p in dashboard.get("panels", []):
        out.append(p)
        out += p.get("panels", [])
    return out


def variable_values(dashboard):
    """{name: the value a test query gives it}: a query variable's allValue
    (every instance, every device)."""
    return {v["name"]: v.get("allValue", ".*") for v in dashboard["templating"]["list"]
            if v.get("type") == "query"}


def substitute(expr, values):
    for name in GRAFANA_INTERVALS:
        expr = expr.replace(name, TEST_RANGE)
    for name, value in values.items():
        expr = expr.replace("${%s}" % name, value).replace("$" + name, value)
    return expr


def dashboard_exprs(dashboard=None):
    """[(where, PromQL)] of every query in the dashboard, Grafana's variables
    replaced; a variable's label_values(SERIES, LABEL) as SERIES."""
    dashboard = dashboard or load_dashboard()
    values = variable_values(dashboard)
    out = []
    for p in panels(dashboard):
        for t in p.get("targets", []):
            out.append((f"panel {p.get('title')!r} {t.get('refId')}", substitute(t["expr"], values)))
    for v in dashboard["templating"]["list"]:
        if v.get("type") != "query":
            continue
        q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
        m = re.fullmatch(r"\s*label_values\((.*),\s*(\w+)\)\s*", q)
        out.append((f"variable {v['name']}", substitute(m.group(1) if m else q, values)))
    return out


COMPARISON = re.compile(r"^(?P<lhs>.*?)\s*(?:>=|<=|==|!=|>|<)\s*(?:bool\s+)?[-+0-9.eE]+\s*$", re.S)


def rule_exprs(rules=None):
    """[(where, PromQL)] of every rule: a recording rule's expression, and an
    alert's expression less its final comparison with a number (what the
    alert compares, which must exist whether or not the alert fires)."""
    rules = rules or load_rules()
    out = []
    for g in rules["groups"]:
        for r in g["rules"]:
            expr = r["expr"].strip()
            if "record" in r:
                out.append((f"record {r['record']}", expr))
            else:
                m = COMPARISON.match(expr)
                out.append((f"alert {r['alert']}", m.group("lhs") if m else expr))
    return out


def render_prometheus_rule():
    body = "".join("  " + line if line.strip() else line
                   for line in RULES.read_text(encoding="utf-8").splitlines(keepends=True)
                   if not line.startswith("#"))
    return PROMETHEUS_RULE_HEADER + body.lstrip("\n")


def all_rules(rules):
    return {r.get("alert") or r.get("record"): r for g in rules["groups"] for r in g["rules"]}


class Dashboard(unittest.TestCase):
    def test_every_query_reads_dgmm_series_through_the_variables(self):
        d = load_dashboard()
        self.assertEqual(d["uid"], "dgmm-server")
        names = {v["name"] for v in d["templating"]["list"]}
        self.assertLessEqual({"datasource", "instance", "device"}, names)
        targets = [(p, t) for p in panels(d) for t in p.get("targets", [])]
        self.assertGreaterEqual(len(targets), 15)
        for p, t in targets:
            with self.subTest(panel=p["title"], ref=t["refId"]):
                self.assertIn("dgmm_", t["expr"])
                self.assertIn('instance=~"$instance"', t["expr"])
                self.assertEqual(p["datasource"]["uid"], "${datasource}")
                self.assertEqual(t["datasource"]["uid"], "${datasource}")

    def test_panels_of_the_triton_views_are_there(self):
        exprs = " ".join(e for _, e in dashboard_exprs())
        for series in ("dgmm_jobs_completed_total", "dgmm_jobs_failed_total", "dgmm_jobs_rejected_total",
                       "dgmm_job_queue_seconds_bucket", "dgmm_job_compute_seconds_bucket",
                       "dgmm_job_transfer_seconds_bucket", "dgmm_budget_reserved_bytes"):
            self.assertIn(series, exprs)

    def test_ids_and_positions_are_unique(self):
        ps = panels(load_dashboard())
        self.assertEqual(len({p["id"] for p in ps}), len(ps))
        cells = set()
        for p in ps:
            g = p["gridPos"]
            for x in range(g["x"], g["x"] + g["w"]):
                for y in range(g["y"], g["y"] + g["h"]):
                    self.assertNotIn((x, y), cells, f"panel {p['title']!r} overlaps another")
                    cells.add((x, y))
            self.assertLessEqual(g["x"] + g["w"], 24)

    def test_variables_are_substituted(self):
        for where, expr in dashboard_exprs():
            self.assertNotIn("$", expr, where)


class Rules(unittest.TestCase):
    def test_the_promised_alerts_exist_and_say_what_they_watch(self):
        rules = load_rules()
        by_name = all_rules(rules)
        for alert, watches in PROMISED_ALERTS.items():
            with self.subTest(alert=alert):
                r = by_name[alert]
                self.assertIn("for", r)
                self.assertIn(r["labels"]["severity"], ("warning", "critical"))
                self.assertTrue(r["annotations"]["summary"])
                expr = r["expr"]
                for name, rec in by_name.items():  # a recording rule it reads
                    if "record" in rec and name in expr:
                        expr += " " + rec["expr"]
                self.assertIn(watches, expr)

    def test_every_alert_compares_something_the_scrape_test_can_query(self):
        exprs = dict(rule_exprs())
        for name in PROMISED_ALERTS:
            lhs = exprs[f"alert {name}"]
            self.assertNotRegex(lhs, r"[<>]=?\s*[0-9.]+\s*$", name)

    def test_kubernetes_prometheus_rule_is_the_rules_file(self):
        rule = yaml.safe_load(PROMETHEUS_RULE.read_text(encoding="utf-8"))
        self.assertEqual(rule["apiVersion"], "monitoring.coreos.com/v1")
        self.assertEqual(rule["kind"], "PrometheusRule")
        self.assertEqual(rule["spec"], load_rules(),
                         "docker/k8s-monitoring/prometheusrule.yaml is stale: "
                         "run tests/monitoring/check_monitoring.py --write")
        self.assertEqual(PROMETHEUS_RULE.read_text(encoding="utf-8"), render_prometheus_rule())

    def test_kustomization_lists_every_manifest(self):
        kust = yaml.safe_load((K8S_MONITORING / "kustomization.yaml").read_text(encoding="utf-8"))
        files = sorted(p.name for p in K8S_MONITORING.glob("*.yaml") if p.name != "kustomization.yaml")
        self.assertEqual(sorted(kust["resources"]), files)


class Compose(unittest.TestCase):
    def test_prometheus_loads_the_rules_and_scrapes_every_dgmm_service(self):
        prom = yaml.safe_load(PROMETHEUS_YML.read_text(encoding="utf-8"))
        compose = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
        monitoring = yaml.safe_load(COMPOSE_MONITORING.read_text(encoding="utf-8"))
        mounts = {}
        for name, s in monitoring["services"].items():
            for v in s.get("volumes", []):
                src, dst = str(v).split(":")[:2]
                if src.startswith("."):
                    self.assertTrue((DOCKER / src).exists(), f"{name} mounts {src}, which is missing")
                    mounts[dst] = (DOCKER / src).resolve()
        # The image reads /etc/prometheus/prometheus.yml; rule_files resolve beside it.
        self.assertEqual(mounts["/etc/prometheus/prometheus.yml"], PROMETHEUS_YML.resolve())
        for f in prom["rule_files"]:
            self.assertEqual(mounts["/etc/prometheus/" + f], RULES.resolve())
        targets = {t for sc in prom["scrape_configs"] for c in sc["static_configs"] for t in c["targets"]}
        servers = [n for n, s in compose["services"].items() if "entrypoint" not in s]
        self.assertTrue(servers)
        for name in servers:
            env = compose["services"][name].get("environment", {})
            port = int(str(env.get("DGMM_METRICS_LISTEN", f":{METRICS_PORT}")).rsplit(":", 1)[1])
            self.assertIn(f"{name}:{port}", targets)
        # Nothing of compose.yaml is redefined, and no host port is published twice.
        self.assertFalse(set(monitoring["services"]) & set(compose["services"]))
        published = [str(p).rsplit(":", 1)[0] for s in list(compose["services"].values())
                     + list(monitoring["services"].values()) for p in s.get("ports", [])]
        self.assertEqual(len(published), len(set(published)))

    def test_grafana_is_provisioned_with_the_dashboard(self):
        monitoring = yaml.safe_load(COMPOSE_MONITORING.read_text(encoding="utf-8"))
        volumes = [str(v) for v in monitoring["services"]["grafana"]["volumes"]]
        self.assertTrue(any(v.startswith("./grafana/dgmm-dashboard.json:") for v in volumes))
        provider = yaml.safe_load((DOCKER / "grafana/provisioning/dashboards/dgmm.yaml").read_text())
        path = provider["providers"][0]["options"]["path"]
        self.assertTrue(any(v.split(":")[1].startswith(path + "/") for v in volumes))


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        PROMETHEUS_RULE.write_text(render_prometheus_rule(), encoding="utf-8")
        print(f"wrote {PROMETHEUS_RULE.relative_to(ROOT)}")
        sys.exit(0)
    unittest.main()
