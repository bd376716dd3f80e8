"""The last mile: builder images to and from a registry (push), wheels repaired to a manylinux tag
(repair), a static pip index of a wheelhouse (index), and a wheelhouse's verified wheels uploaded to
PyPI-compatible indexes, the Hugging Face Hub, GitHub releases and S3 (upload, one module per
destination)."""
