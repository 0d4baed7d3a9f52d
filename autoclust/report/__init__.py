"""What autoclust tells users: explain, dumps, the HTML graph, progress."""
