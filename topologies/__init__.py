"""topologies: clusters as networkx graphs, rank placement, routing and fabric views.

>>> from topologies import build_cluster, fabric_view
>>> c = build_cluster("dgx-h100", nodes=4)
>>> fabric_view(c).ring.bottleneck_tier
"""
from topologies.attrs import GraphError, validate_graph
from topologies.catalog import catalog_names, load_spec
from topologies.cluster import Cluster, build_cluster, cluster_for
from topologies.errors import InputError
from topologies.fabricview import FabricView, PatternView, TierView, fabric_view
from topologies.placement import place

__all__ = ["Cluster", "FabricView", "GraphError", "InputError", "PatternView", "TierView",
           "build_cluster", "cluster_for", "catalog_names", "fabric_view", "load_spec", "place", "validate_graph"]
__version__ = "0.1.0"
