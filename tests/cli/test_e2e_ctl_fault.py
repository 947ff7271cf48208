"""`podvisorctl fault inject|list|clear` against a real agent (issue 28): what it prints, its
exit codes, and each fault's start and end as events."""

from __future__ import annotations

import json

from podvisor.testing import Node, wait_until


def test_inject_list_clear_and_the_events_of_each_start_and_end(podvisor_node: Node) -> None:
    ctl = podvisor_node.agent.ctl
    done = ctl("fault", "inject", "bus", "pleg", "--action", "delay", "--delay", "200ms",
               "--direction", "recv", "--topics", "clone.,pleg.", "--for", "1m", "--json")
    assert done.returncode == 0, done.stderr
    fault = json.loads(done.stdout)
    assert fault["spec"] == {"kind": "bus", "target": "pleg", "action": "delay", "delay": 0.2,
                             "direction": "recv", "topics": ["clone.", "pleg."], "rate": 1.0,
                             "for": 60.0}
    assert fault["expires"] == fault["started"] + 60.0
    short = ctl("fault", "inject", "stop", "imagegc", "--for", "500ms")
    assert short.returncode == 0 and "f2" in short.stdout and "stop" in short.stdout
    listed = ctl("fault", "list")
    assert listed.returncode == 0
    assert "f1" in listed.stdout and "bus" in listed.stdout and "pleg" in listed.stdout
    wait_until(lambda: "f2" not in ctl("fault", "list").stdout, 30, 0.1, "f2 to expire")
    cleared = ctl("fault", "clear", "f1")
    assert cleared.returncode == 0 and cleared.stdout.startswith("cleared:")
    assert ctl("fault", "list").stdout.strip() == "no faults in force"
    events = json.loads(ctl("events", "--json").stdout)["items"]
    said = [(e["reason"], e["message"]) for e in events
            if e["involvedObject"]["kind"] == "Fault"]
    assert said[0] == ("FaultInjected", "f1 bus pleg: delay recv 0.2s topics clone.,pleg. "
                                         "for 60s")
    assert ("FaultInjected", "f2 stop imagegc: SIGSTOP for 0.5s") in said
    assert any(r == "FaultCleared" and m.startswith("f2 stop imagegc: SIGSTOP: expired after")
               for r, m in said)
    assert any(r == "FaultCleared" and m.startswith("f1 bus pleg: delay recv 0.2s topics "
                                                    "clone.,pleg.: cleared after")
               for r, m in said)
    kill = ctl("fault", "inject", "kill", "prober", "--signal", "TERM")
    assert kill.returncode == 0 and "instant" in kill.stdout
    podvisor_node.agent.wait_state("prober", "RUNNING", 30)


def test_bad_requests_are_refused_with_the_reason(podvisor_node: Node) -> None:
    ctl = podvisor_node.agent.ctl
    bad = ctl("fault", "inject", "bus", "pleg", "--action", "scramble")
    assert bad.returncode == 1
    assert "BAD_ARGUMENTS(3): 'action' must be one of drop, delay, duplicate" in bad.stderr
    nobody = ctl("fault", "inject", "stop", "nosuch")
    assert nobody.returncode == 1 and "BAD_NAME(10): no process named 'nosuch'" in nobody.stderr
    sig = ctl("fault", "inject", "kill", "pleg", "--signal", "NOPE")
    assert sig.returncode == 1 and "BAD_SIGNAL(11)" in sig.stderr
    dur = ctl("fault", "inject", "stop", "pleg", "--for", "5 minutes")
    assert dur.returncode == 2 and "bad duration" in dur.stderr
    kind = ctl("fault", "inject", "flood", "pleg")
    assert kind.returncode == 2 and "invalid choice: 'flood'" in kind.stderr
    unknown = ctl("fault", "clear", "f99")
    assert unknown.returncode == 1 and "BAD_NAME(10): no fault 'f99' in force" in unknown.stderr
    assert ctl("fault", "clear").stdout.strip() == "no fault cleared"
