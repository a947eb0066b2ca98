# What a fresh run says where train.log holds an earlier run's rows (utrain.logtail.
# last_logged, loaded for the call and dropped: a run again of a trained folder had said
# only '(not better than epoch 0)' of the earlier run's weights).


def say(files, start, at):
    ck, out = files.get('checkpoint'), files['out']
    print('utrain: %s holds an earlier run (to epoch %s): this run starts again at epoch %d '
          'from %s, its rows under a header of their own; %s' % (
              files['log'], at, not files.get('test'),
              start + (' (the best weights so far)' if start == out else ' (the prepared weights)'),
              'to go on from that run\'s last weights instead: "resume": true under "run" in '
              'train.json with "epochs" raised (%s)' % ck if ck and start != out else
              'its best weights, %s, are replaced only by better ones' % out))
