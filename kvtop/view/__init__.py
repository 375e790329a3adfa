"""What a person reads, without Textual: rows, cells, number formats, the engine and GPU
views, groups and charts; the app's widgets and the headless table render these."""
