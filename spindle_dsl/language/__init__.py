"""The .spindle language front end."""
