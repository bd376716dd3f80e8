"""The helper a Windows script runs, written out by the script as it is (render.windows.HELPER_MODULES)."""
