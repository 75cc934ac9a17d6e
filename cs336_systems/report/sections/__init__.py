"""One module per handout problem (or group of problems); see ``cs336_systems.report``."""
