"""Widgets that draw state handed to them; none of them collects anything."""
