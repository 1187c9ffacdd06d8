"""``python -m asynccoord.demo``: real chat traffic, several processes, injected faults, proof.

The demo replays real one-to-one chat messages (a bundled sample of the BYU PCC
Chit-Chat trace, MIT) as the outgoing messages of a bot: each message becomes a task
keyed by its conversation, sent from one of a fixed set of bot accounts, through a
simulated messaging gateway that keeps its own record of every delivery. Nodes in
several OS processes drain the queue while one process is killed with SIGKILL and one
stalls past its lease and lock TTL. The final report says whether any message was
delivered twice, lost, sent out of order, or sent while its account was busy.
"""
