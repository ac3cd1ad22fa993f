"""Memoized rule results: the bounded, thread-safe cache, its keys, which calls may be memoized
and how a hit is rebuilt (`cache`), and the backend flags that choose kernels (`backend_flags`)."""
