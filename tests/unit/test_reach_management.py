"""Which management API answers for the broker an AMQP connection reached."""

from __future__ import annotations

from typing import Any

from delayq.errors import ManagementUnavailable
from delayq.ops.management import ManagementAPI
from delayq.sync._broker import ManagementChoice, reach_management


class FakeAPI(ManagementAPI):
    def __init__(self, cluster: str, nodes: list[str] | None) -> None:
        super().__init__("http://u:p@h:15672/")
        self.cluster, self.nodes = cluster, nodes

    def overview(self) -> dict[str, Any]:
        node = "delayq-A@localhost"  # the node that serves the API
        return {"cluster_name": self.cluster, "node": node, "rabbitmq_version": "4.3.6"}

    def node_names(self) -> list[str]:
        if self.nodes is None:
            raise ManagementUnavailable("no answer")
        return self.nodes


class Impl:
    def __init__(self, cluster: str) -> None:
        self.server_properties = {"cluster_name": cluster.encode()}


class Connection:
    def __init__(self, cluster: str) -> None:
        self._impl = Impl(cluster)


NODES = ["delayq-A@localhost", "delayq-B@localhost", "delayq-C@localhost"]


def test_a_cluster_without_a_name_is_known_by_its_nodes_names() -> None:
    """Each node of a cluster whose ``cluster_name`` was never set reports its own name:
    through a multi-host URL the AMQP connection and the API met different nodes, in about
    2 calls of 3 (`delayq stats` and `topology verify` then refused the API)."""
    api = FakeAPI("delayq-A@vm", NODES)  # default names: <node name>@<the host's FQDN>
    reach = reach_management(ManagementChoice(api, explicit=False), Connection("delayq-B@vm"))
    assert reach.api is api and not reach.failed
    named = FakeAPI("delayq-A@localhost", NODES)  # a node's own name, as 4.x may report
    assert reach_management(named, Connection("delayq-C@localhost")).api is named


def test_another_clusters_api_is_still_refused() -> None:
    api = FakeAPI("delayq-A@vm", NODES)
    reach = reach_management(ManagementChoice(api, explicit=True), Connection("other@elsewhere"))
    assert reach.api is None and reach.failed
    chosen = FakeAPI("production", NODES)  # a name set by the operator: names must match
    reach = reach_management(ManagementChoice(chosen, explicit=True), Connection("delayq-B@vm"))
    assert reach.api is None and reach.failed
    assert "answers for cluster 'production'" in reach.detail
    silent = FakeAPI("delayq-A@vm", None)  # cannot list its nodes: not taken on trust
    assert reach_management(silent, Connection("delayq-B@vm")).api is None
