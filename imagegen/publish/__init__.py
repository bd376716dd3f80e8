"""The last mile: builder images to and from a registry."""
