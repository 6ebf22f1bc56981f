"""Questions asked of the model over many plans: the plan sweep (``sweep``), the search under an error
budget (``search``) with its executors and resumable CSV stream, the cost of a token budget (``cost``),
the convergence penalty of compression (``convergence``) and the break-even codec speed (``breakeven``).
"""
