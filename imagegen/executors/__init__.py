"""Ways to run planned cells: buildx bake, a native build on this host, a prebuilt builder image.
Each hands its staged wheels to the finish step it is given."""
