"""The ``fxprop`` command line: parsing (`main`), loading models and inputs (`loading`),
text formats (`formats`), pictures (`drawing`) and stage progress (`progress`)."""
