"""The results layout and its one reader: what every stage agrees a result folder is."""
