"""The image training template: build the network, train a recipe's section, evaluate the final checkpoint."""
