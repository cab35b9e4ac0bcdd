"""Which monitor watches the cluster: read from the status blob Ray's monitor publishes."""

import json

from hypothesis import given
from hypothesis import strategies as st

from relay_rl.services.driver.cluster import is_launching_autoscaler

# Published by `ray.init()` on this machine (Ray 2.60): a read-only monitor, one node typed by its id.
LOCAL = {
    "autoscaler_report": {
        "active_nodes": {"node_1ee66aac": 1},
        "node_type_mapping": {"1ee66aac": "node_1ee66aac"},
        "legacy": True,
    },
    "load_metrics_report": {"usage": {"CPU": [0.0, 2.0]}},
}


def test_a_local_or_hand_made_cluster_is_not_autoscaling():
    assert not is_launching_autoscaler(json.dumps(LOCAL).encode())
    two = json.loads(json.dumps(LOCAL))
    two["autoscaler_report"]["node_type_mapping"]["77aa"] = "node_77aa"
    assert not is_launching_autoscaler(json.dumps(two).encode())


def test_a_configured_autoscaler_names_its_node_types():
    named = json.loads(json.dumps(LOCAL))
    named["autoscaler_report"]["node_type_mapping"] = {"1ee66aac": "ray.head.default", "77aa": "cpu_rollout"}
    assert is_launching_autoscaler(json.dumps(named).encode())


@given(
    st.one_of(
        st.none(),
        st.binary(max_size=64),
        st.recursive(
            st.none() | st.text(max_size=8), lambda c: st.dictionaries(st.text(max_size=8), c, max_size=3)
        ).map(lambda v: json.dumps(v).encode()),
    )
)
def test_any_blob_reads_without_raising(raw):
    assert is_launching_autoscaler(raw) in (True, False)
