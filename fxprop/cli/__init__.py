"""The ``fxprop`` command line: parsing (`main`), loading models and inputs (`loading`),
text formats (`formats`), pictures (`drawing`, the graph; `estimate_report`, live bytes, with
`module_spans` to mark the model's parts), stage progress (`progress`), and tracing with a
fallback from one tracer to the next (`tracing`, for tools/coverage_report.py)."""
