"""What a search leaves: result files, plots, the HTML report, the terminal tables."""
