"""What real ATen kernels do that torch's meta kernels do not: how results are laid out
(`layout`, `view_strides`), what in-place ops refuse (`in_place`), which dtypes the host's
kernels implement (`host_dtypes`), which writes into memory an input occupies the host's kernels
refuse (`host_overlap`), and where index values known from ``arange`` must stay in
range (`index_values`)."""
