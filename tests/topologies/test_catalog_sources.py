"""Every number of a catalog cluster has its source beside it (the cluster file's [sources])."""
import pytest

from topologies import catalog_names, load_spec

# Clusters added with a source for every number, key by key; the older files cite some keys
# together ("node", "node.latency"), which test_every_cluster_cites_its_node_and_fabric accepts.
SOURCED_KEY_BY_KEY = ("dgx-b200", "dgx-b300", "gb200-nvl72", "gb300-nvl72", "mi300x")


def _numbers(spec: dict) -> list[str]:
    """``section.key`` of every number or switch of a cluster file (``default_nodes`` included)."""
    keys = ["default_nodes"]
    for section in ("node", "fabric"):
        keys += [f"{section}.{k}" for k, v in spec[section].items() if isinstance(v, (bool, int, float))]
    return keys


@pytest.mark.parametrize("name", SOURCED_KEY_BY_KEY)
def test_every_number_of_a_new_cluster_has_its_own_source(name):
    spec = load_spec(name)[0]
    sources = spec.get("sources", {})
    missing = [k for k in _numbers(spec) if not str(sources.get(k, "")).strip()]
    assert not missing, f"{name}: no source for {missing}"
    assert not [k for k in sources if k not in _numbers(spec)], "a source for a key the file does not have"


@pytest.mark.parametrize("name", catalog_names())
def test_every_cluster_cites_its_node_and_fabric(name):
    sources = load_spec(name)[0].get("sources", {})
    assert any(k.startswith("node") for k in sources) and any(k.startswith("fabric") for k in sources)


def test_the_new_clusters_are_in_the_catalog():
    assert set(SOURCED_KEY_BY_KEY) <= set(catalog_names())
