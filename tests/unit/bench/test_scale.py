"""The ``scale`` benchmark's pure pieces: the overlay's NATS config on loopback, the
apiserver's write counts, memory against N, the goals it judges and the lines it prints."""

from __future__ import annotations

import json
import math

import pytest

from bench.__main__ import main
from bench.fleetsim import batches
from bench.natscluster import OVERLAY_CONF, NatsServer, server_config
from bench.scenarios.scale import (
    SERVICES,
    Measured,
    ScaleReport,
    Sizes,
    apiserver_writes,
    apiserver_writes_by,
    fleet_of,
    goals,
    slope,
)

METRICS = """\
# HELP apiserver_request_total Counter of apiserver requests.
# TYPE apiserver_request_total counter
apiserver_request_total{code="201",component="apiserver",dry_run="",group="resource.k8s.io",resource="resourceslices",scope="cluster",subresource="",verb="POST",version="v1"} 200
apiserver_request_total{code="200",component="apiserver",dry_run="",group="resource.k8s.io",resource="resourceslices",scope="cluster",subresource="",verb="LIST",version="v1"} 9
apiserver_request_total{code="200",component="apiserver",dry_run="",group="coordination.k8s.io",resource="leases",scope="resource",subresource="",verb="PATCH",version="v1"} 1000
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="nodes",scope="resource",subresource="status",verb="PATCH",version="v1"} 30
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="nodes",scope="resource",subresource="",verb="PUT",version="v1"} 4
"""


def test_the_overlay_config_is_kept_but_for_names_addresses_routes_and_store() -> None:
    server = NatsServer(name="nats-2", client=4001, monitor=4002, route=4003, store=OVERLAY_CONF)
    text = server_config(OVERLAY_CONF.read_text(), server, [5001, 4003, 5003])
    assert "server_name: nats-2" in text
    assert "listen: 127.0.0.1:4001" in text
    assert "http: 127.0.0.1:4002" in text
    assert "listen: 127.0.0.1:4003" in text
    assert "nats://127.0.0.1:5001\n    nats://127.0.0.1:4003\n    nats://127.0.0.1:5003" in text
    assert "svc:6222" not in text
    assert "$POD_NAME" not in text.split("\n", 2)[2]
    for kept in ("max_payload: 1MB", "max_file_store: 8GB", "name: neuron-dra", "lame_duck"):
        assert kept in text


def test_a_changed_overlay_config_is_refused_naming_what_is_missing() -> None:
    server = NatsServer(name="nats-0", client=1, monitor=2, route=3, store=OVERLAY_CONF)
    with pytest.raises(ValueError, match="expected one 'store_dir: /data'"):
        server_config(OVERLAY_CONF.read_text().replace("/data", "/srv"), server, [3])


def test_writes_are_the_mutating_requests_of_the_resources_asked_for() -> None:
    assert apiserver_writes(METRICS, only=("resourceslices",)) == 200
    assert apiserver_writes(METRICS) == 1234
    assert apiserver_writes(METRICS, skip=(("leases", ""), ("nodes", "status"))) == 204


def test_writes_by_request_count_applies_and_name_failed_answers() -> None:
    applies = (
        METRICS
        + 'apiserver_request_total{code="201",resource="neuronultraserverworkloads",'
        + 'subresource="status",verb="APPLY"} 7\n'
        + 'apiserver_request_total{code="409",resource="nodes",subresource="",verb="PATCH"} 3\n'
    )
    assert apiserver_writes_by(applies, skip=(("leases", ""), ("nodes", "status"))) == {
        "POST resourceslices": 200,
        "PUT nodes": 4,
        "APPLY neuronultraserverworkloads/status": 7,
        "PATCH nodes 409": 3,
    }


def test_memory_slope_is_per_thousand_nodes_and_its_exponent_shows_faster_than_linear() -> None:
    per_k, exponent = slope({1000: 100.0, 10_000: 1000.0})
    assert per_k == pytest.approx(100.0)
    assert exponent == pytest.approx(1.0)
    assert slope({1000: 100.0, 10_000: 2000.0})[1] > 1.1
    assert math.isnan(slope({1000: 100.0})[0])


def test_batches_spread_every_node_over_the_period_once() -> None:
    names = [f"n{i}" for i in range(1001)]
    parts = batches(names, 10.0)
    assert len(parts) == 10
    assert [n for part in parts for n in part] == names


def test_a_fleet_size_must_fill_whole_ultraservers() -> None:
    with pytest.raises(ValueError, match="--nodes: 102 is not a positive multiple of 4"):
        Sizes.of(102, quick=True)
    assert Sizes.of(100, quick=True).workloads == 25
    assert Sizes.of(1000, quick=False).workloads == 100


def measured(n: int, *, lost: float, detector: float, rss: float) -> Measured:
    return Measured(
        sizes=Sizes.of(n, quick=False),
        slices_s=11.0,
        bare_s=10.0,
        taint_s=[0.05, 0.08],
        lost_s=[3.0, lost],
        allocated_s=[2.0, 4.0],
        writes_per_workload=20.0,
        steady_cores={"failure-detector": detector},
        rss_mib={s: rss for s in SERVICES},
    )


def test_each_goal_is_judged_on_its_own_figure() -> None:
    ok = goals(measured(10_000, lost=4.9, detector=0.4, rss=900.0))
    assert all(ok.values())
    missed = goals(measured(10_000, lost=5.2, detector=0.6, rss=1100.0))
    assert missed == {
        "lost node p99 <= 5 s": False,
        "detector under half a core": False,
        "slices cold <= 1.2 x bare": True,
        "all workloads Allocated <= 30 s": True,
        "no service over 1 GiB": False,
    }


def test_the_report_prints_each_n_a_json_line_each_and_memory_against_n() -> None:
    report = ScaleReport(
        runs=[
            measured(1000, lost=3.1, detector=0.05, rss=100.0),
            measured(5000, lost=3.2, detector=0.2, rss=600.0),
        ]
    )
    table = report.table()
    assert "== scale (1,000 trn2u nodes, 250 UltraServers)" in table
    assert "  lost node p99 <= 5 s: met" in table
    assert "judged at 5,000" in table
    assert "slice-publisher: +125.0 MiB per 1,000 nodes, exponent 1.11  faster than linear" in table
    lines = [json.loads(line) for line in report.json_line().splitlines()]
    assert [line["nodes"] for line in lines] == [1000, 5000]
    assert lines[1]["goals"]["detector under half a core"] == "met"
    assert lines[0]["figures"]["slices from cold"]["ratio"] == pytest.approx(1.1)


def test_nodes_is_refused_for_another_scenario(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["slices", "--nodes", "100"])
    assert exited.value.code == 2
    assert "--nodes: only the scale scenario takes it, not slices" in capsys.readouterr().err


@pytest.mark.parametrize("flag", ["--failover", "--chaos"])
def test_failover_and_chaos_are_refused_for_another_scenario(
    flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["bus", flag])
    assert exited.value.code == 2
    assert f"{flag}: only the scale scenario takes it, not bus" in capsys.readouterr().err


@pytest.mark.parametrize("n", [100, 5000, 10000])
def test_the_fleet_has_n_nodes_in_n_over_4_ultraservers_past_a_fleet_files_group_limit(
    n: int,
) -> None:
    # A fleet file's group holds at most 1,000 UltraServers: 10,000 nodes take three groups.
    labels, where = fleet_of(n)
    assert len(labels) == n
    assert len({w.server_id_4 for w in where.values()}) == n // 4
    assert {w.node_id_4 for w in where.values()} == {0, 1, 2, 3}
