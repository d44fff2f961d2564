"""Extensions written the way a user writes them: new files outside rredcot, picked by YAML."""
