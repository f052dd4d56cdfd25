// placeholder so the area library is never empty
