// placeholder; delete once the folder has real sources
