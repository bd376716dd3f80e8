"""The scripts a builder image runs, copied into it as they are (render.dockerfile.BUILDER_FILES)."""
